"""Below the nightly, end to end through the CLI: a fake nightly index and a fake pytorch.

The fake pytorch repository has a main branch (a Python-only commit, a native commit, the
Python-only culprit, docs) and a nightly branch whose commits name the main commits the
two nightlies were built from. The nightly index serves two fake `torch` wheels built
from those main commits, with `torch.version.git_version` the nightly branch commit, as
real nightlies have. `distci bisect --below-nightly` must land on the two nightlies, map
them to main, overlay each main commit's Python on the matching binary and name the
culprit: the code a real run takes, with DISTCI_GIT_PYTORCH pointing at a real clone.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import re
import threading
import zipfile
from pathlib import Path

import pytest

from distci import cli
from test_bisect_git import Repo

CHECK = "python -c 'import sys, torch; sys.exit(0 if torch.scale(3) == 6 else 1)'"


@pytest.fixture(autouse=True)
def _archive(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTCI_WHEELHOUSE_ROOT", str(tmp_path / "wheelhouse"))
    monkeypatch.setenv("DISTCI_ENV_ROOT", str(tmp_path / "envs"))


def torch_wheel(directory: Path, version: str, files: dict[str, str]) -> Path:
    dist_info = f"torch-{version}.dist-info"
    files = dict(files, **{
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: distci-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    })
    record = [f"{name},sha256={_b64(text.encode())},{len(text.encode())}" for name, text in files.items()]
    files[f"{dist_info}/RECORD"] = "\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n"
    path = directory / f"torch-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture
def pytorch(tmp_path, monkeypatch):
    """(repo, main commits, index URL)."""
    repo = Repo(tmp_path / "pytorch")
    init = "from torch import version\nfrom torch._impl import scale\n"
    main = [repo.commit("good nightly's commit", {"torch/__init__.py": init, "csrc/kernel.cpp": "v0\n",
                                                  "torch/_impl.py": "def scale(x):\n    return 2 * x\n"})]
    main.append(repo.commit("python: add util", {"torch/_util.py": "U = 1\n"}))
    main.append(repo.commit("native: new kernel", {"csrc/kernel.cpp": "v1\n"}))
    main.append(repo.commit("python: faster scale",
                            {"torch/_impl.py": "def scale(x):\n    return x + x + (x == 3)\n"}))
    main.append(repo.commit("docs", {"docs/index.rst": "torch\n"}))
    repo.git("checkout", "-q", "--orphan", "nightly")
    nightlies = {
        "20260301": repo.commit(f"2026-03-01 nightly release ({main[0]})", {"x": "1"}),
        "20260302": repo.commit(f"2026-03-02 nightly release ({main[0]})", {"x": "2"}),
        "20260303": repo.commit(f"2026-03-03 nightly release ({main[-1]})", {"x": "3"}),
    }
    repo.git("checkout", "-q", "main")
    root = tmp_path / "index"
    (root / "files").mkdir(parents=True)
    wheels = []
    for day, nightly in nightlies.items():
        built = main[-1] if day == "20260303" else main[0]
        tree = {p: repo.git("show", f"{built}:{p}") + "\n"
                for p in repo.git("ls-tree", "-r", "--name-only", built, "torch").splitlines()}
        tree["torch/version.py"] = f"git_version = {nightly!r}\n"
        tree["torch/_C.py"] = f"KERNEL = {repo.git('show', f'{built}:csrc/kernel.cpp')!r}\n"
        wheels.append(torch_wheel(root / "files", f"1.0.0.dev{day}", tree))
    page = root / "simple" / "torch"
    page.mkdir(parents=True)
    page.joinpath("index.html").write_text("".join(
        f'<a href="../../files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a><br/>\n'
        for w in wheels))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield repo, main, f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.slow
def test_below_the_nightly_the_cli_names_the_main_commit(pytorch, tmp_path, monkeypatch, capsys):
    repo, main, index = pytorch
    monkeypatch.setenv("DISTCI_GIT_PYTORCH", str(repo.path))
    monkeypatch.setenv("DISTCI_NIGHTLY_INDEX_URL", index)
    argv = ["bisect", "--command", CHECK, "--axis", "torch", "--source", "nightly",
            "--good", "2026-03-01", "--bad", "2026-03-03", "--below-nightly",
            "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "first bad: torch==1.0.0.dev20260303 (last good: torch==1.0.0.dev20260302)" in out
    assert f"below the nightly: main {main[0][:12]} .. {main[-1][:12]}: 4 commits, 2 Python-only, 1 native" in out
    assert f"first bad main commit {main[3][:12]} python: faster scale" in out
    report = json.loads(Path(re.search(r"^report: (.+)$", out, re.MULTILINE).group(1)).read_text())
    below = report["below_nightly"]
    assert below["status"] == "boundary" and below["culprit"] == main[3]
    assert below["native"] == [main[2]]
    assert [(c["subject"], c["kind"], c["binary"]) for c in below["list"]] == [
        ("python: add util", "python", "good"), ("native: new kernel", "native", "bad"),
        ("python: faster scale", "python", "bad"), ("docs", "inert", "bad")]
    old, new = _nightly(repo, "2026-03-02"), _nightly(repo, "2026-03-03")
    assert report["commits"] == {"last_old": old, "first_new": new,
                                 "compare": f"https://github.com/pytorch/pytorch/compare/{old}...{new}"}


def _nightly(repo: Repo, day: str) -> str:
    return repo.git("log", "nightly", "--format=%H", f"--grep={day} nightly release").strip()
