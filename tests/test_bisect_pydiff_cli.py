"""`distci bisect python-diff` end to end over two fake torch wheels in a wheelhouse.

The bad build declares a dependency (`tdep`, a local wheel) in its metadata and the check
imports it and `cdep` (given by --check-requires): a cold run with no --base-env must
install both into the shared base from the bad build's metadata, or every probe skips.
Both builds carry torch/version.py with a git_version, so the pointer upstream names
both commits and the compare URL; a fake GitHub API serves the range for the pull
requests.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zipfile
from pathlib import Path

import pytest

from distci import cli

GOOD_GIT, BAD_GIT = "1" * 40, "2" * 40
OPS = "import math\n\n\ndef scale(x):\n    # one\n    # two\n    y = 0\n    return {scale}\n\n\nPI = {pi}\n"
CHECK = "python -c 'import sys, tdep, cdep, torch; sys.exit(0 if torch.ops.scale(3) == 6 else 1)'"


def wheel(directory: Path, name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> Path:
    info = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = dict(files, **{f"{info}/METADATA": meta, f"{info}/WHEEL": (
        "Wheel-Version: 1.0\nGenerator: distci-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")})
    record = [f"{n},sha256={_b64(t.encode())},{len(t.encode())}" for n, t in files.items()]
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    path = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for n, t in files.items():
            archive.writestr(n, t)
    return path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture
def house(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTCI_WHEELHOUSE_ROOT", str(tmp_path / "wheelhouse"))
    monkeypatch.setenv("DISTCI_ENV_ROOT", str(tmp_path / "envs"))
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    monkeypatch.delenv("GH_TOKEN", raising=False)
    d = tmp_path / "wheels"
    d.mkdir()
    init = "from torch import ops, util\n"
    wheel(d, "torch", "9.1.0", {"torch/__init__.py": init, "torch/util.py": "U = 1\n",
                                "torch/ops.py": OPS.format(scale="2 * x", pi="3.14"),
                                "torch/version.py": f"__version__ = '9.1.0'\ngit_version = '{GOOD_GIT}'\n"})
    wheel(d, "torch", "9.1.1", {"torch/__init__.py": init, "torch/util.py": "U = 2\n",
                                "torch/ops.py": OPS.format(scale="x + x + (x == 3)", pi="math.pi").replace(
                                    "    # one\n    # two\n    y = 0\n", "    # ONE\n    y = 1\n"),
                                "torch/version.py": f"__version__ = '9.1.1'\ngit_version = '{BAD_GIT}'\n"},
          requires=("tdep",))
    wheel(d, "tdep", "1.0", {"tdep/__init__.py": ""})
    wheel(d, "cdep", "1.0", {"cdep/__init__.py": ""})
    return d


def _argv(tmp_path, house, *extra):
    return ["bisect", "python-diff", "--command", CHECK, "--source", "wheelhouse", "--wheelhouse", str(house),
            "--no-index", "--check-requires", "cdep", "--cache", str(tmp_path / "cache"),
            "--out", str(tmp_path / "out"), *extra]


@pytest.mark.slow
def test_a_cold_run_installs_the_bad_builds_dependencies_and_names_the_lines(house, tmp_path, capsys):
    md = tmp_path / "report.md"
    assert cli.main(_argv(tmp_path, house, "--good", "9.1.0", "--bad", "9.1.1", "--markdown", str(md))) == 0
    out = capsys.readouterr().out
    assert re.search(r"^estimate: \d+ wheels, .* of disk", out, re.MULTILINE)
    assert "dependencies shared by both builds" in out
    assert "+    return x + x + (x == 3)" in out and "torch/ops.py" in out
    assert f"good build: git {GOOD_GIT}" in out and f"bad build:  git {BAD_GIT}" in out
    assert f"compare: https://github.com/pytorch/pytorch/compare/{GOOD_GIT}...{BAD_GIT}" in out
    assert "set GITHUB_TOKEN" in out
    # the hunk of ops.py that matters is narrowed to its one changed line
    report = json.loads(next((tmp_path / "out").rglob("pydiff-*.json")).read_text())
    assert report["status"] == "found" and report["files"] == ["torch/ops.py"]
    [line] = report["lines"]
    assert "-    return 2 * x" in line["diff"] and "# ONE" not in line["diff"]
    assert report["upstream"]["compare"].endswith(f"{GOOD_GIT}...{BAD_GIT}")
    assert "rerun: nox -s bisect -- python-diff" in out
    assert "compare:" in md.read_text() and GOOD_GIT in md.read_text()
    # the same command again: every probe from the state
    assert cli.main(_argv(tmp_path, house, "--good", "9.1.0", "--bad", "9.1.1")) == 0
    again = capsys.readouterr().out
    assert "plan: from" in again and "(from state)" in again and re.search(r"\(\d+ check runs this session", again).group(0) == "(0 check runs this session"


@pytest.mark.slow
def test_swapped_endpoints_and_a_flaky_check_say_so_and_exit_non_zero(house, tmp_path, capsys):
    assert cli.main(_argv(tmp_path, house, "--good", "9.1.1", "--bad", "9.1.0")) == 2
    err = capsys.readouterr().err
    assert "swapped" in err and "--find-fix" in err
    counter = tmp_path / "calls"
    # answers right on odd calls, wrong on even ones: the second run of the first probe disagrees
    flaky = ("python -c 'import pathlib, sys, torch; p = pathlib.Path(sys.argv[1]); n = int(p.read_text() "
             "if p.exists() else 0) + 1; p.write_text(str(n)); ok = torch.ops.scale(3) == 6; "
             "sys.exit(0 if ok == (n % 2 == 1) else 1)' " + str(counter))
    argv = _argv(tmp_path, house, "--good", "9.1.0", "--bad", "9.1.1", "--repeats", "2", "--markdown",
                 str(tmp_path / "flaky.md"))
    argv[argv.index(CHECK)] = flaky
    assert cli.main(argv) == 1
    captured = capsys.readouterr()
    assert "is flaky" in captured.err and "no change named" in captured.err
    report = json.loads(next((tmp_path / "out").rglob("pydiff-*.json")).read_text())
    assert report["status"] == "flaky" and report["log"]  # what was learned so far is reported
    assert (tmp_path / "flaky.md").exists()
