"""Hostile or odd text in what distci hands to other systems (issue 28, Build 7):
$GITHUB_OUTPUT entries, Slack mrkdwn, and the matrix JSON on stdout."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from jobsteps import _read_outputs

from distci.ci.actions import output_lines, write_outputs
from distci.publish.notify import _message, code, gate_message, link, mrkdwn, regressions_message
from distci.judge.rows import ResultRow

FORGED = "cpu-cell\nconclusion=success"


def test_a_newline_in_an_output_value_never_forges_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored cell id with a line break is written in GitHub's heredoc form with a
    random delimiter: the runner reads back one value, and no `conclusion` key."""
    out = tmp_path / "github_output"
    monkeypatch.setenv("GITHUB_OUTPUT", str(out))
    write_outputs({"cell": FORGED, "post": "true", "conclusion": "failure"})
    assert _read_outputs(out) == {"cell": FORGED, "post": "true", "conclusion": "failure"}
    text = out.read_text()
    assert "\ncell=" not in text and text.startswith("cell<<ghadelimiter_")
    # what the old `key=value` writer produced: the runner would have read conclusion=success
    naive = tmp_path / "naive"
    naive.write_text(f"cell={FORGED}\n")
    assert _read_outputs(naive)["conclusion"] == "success"
    for bad in ("a=b", "x\ny", "k<<EOF", ""):
        with pytest.raises(ValueError, match="not a step output name"):
            output_lines({bad: "v"})
    assert output_lines({"cr": "a\rb"}).startswith("cr<<ghadelimiter_")


def _row(test_id: str, cell: str, sig: str) -> ResultRow:
    return ResultRow("r", test_id, cell, "tp", "failed", "regression", None, "", 1.0, "assert", sig, "", "", None, 0,
                     [], "")


def test_slack_text_is_escaped() -> None:
    """A test id or signature cannot open a link, mention the channel or end a code span;
    the dashboard link is http(s) only."""
    assert mrkdwn("<!channel> & <https://evil|x>") == "&lt;!channel&gt; &amp; &lt;https://evil|x&gt;"
    assert code("a`b<c>") == "`a'b&lt;c&gt;`"
    assert link("javascript:alert(1)", "dashboard") == ""
    assert link("https://ci.example/a|b>c", "d") == "<https://ci.example/a%7Cb%3Ec|d>"
    msg = regressions_message([_row("suites/t.py::test[<!here>`]", "cell<x>", "RuntimeError: <@U123> & `boom`")],
                              "javascript:alert(1)")
    body = msg["blocks"][1]["text"]["text"]
    assert "<!here>" not in body and "<@U123>" not in body and "&lt;@U123&gt; &amp; 'boom'" in body
    assert "javascript" not in body and "cell&lt;x&gt;" in body
    header = _message("gate <!channel>", [], "")["blocks"][0]["text"]["text"]
    assert header == "*gate &lt;!channel&gt;*"

    class View:
        status, tier = "BLOCKED", "release"
        blocking = [_row("suites/t.py::x", "c", "E: <b>")]
        not_ok: list = []

    assert "E: &lt;b&gt;" in gate_message(View())["blocks"][1]["text"]["text"]


MATRIX_HEAD = """\
schema = 1

[accelerators.cpu]
backend = "gloo"
runner = ["ubuntu-latest"]
archs = ["x86_64"]
variants = ["cpu"]
"""


def _matrix(tmp_path: Path, container: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(MATRIX_HEAD + container + '\n[[matrix]]\naccelerator = "cpu"\ntorch = "2.13.0"\n'
                    'torchao = "0.18.0"\n\n[tiers.nightly]\nblocking_suites = []\n')
    return path


def test_container_limits_come_from_the_matrix_per_accelerator(tmp_path: Path) -> None:
    """memory, pids and CPUs (capped at this host's count) per accelerator; CPU cells get
    no network; a bad value is an error at its file:line naming what is allowed."""
    pytest.importorskip("docker")
    import os

    from distci.images.run import UNPRIVILEGED_USER, container_options, container_user
    from distci.matrix import MatrixError, load_matrix

    path = _matrix(tmp_path, '\n[accelerators.cpu.container]\nmemory = "12g"\npids = 2048\ncpus = 512\n')
    cell = load_matrix(path).cells[0]
    assert (cell.container.memory, cell.container.pids, cell.container.cpus) == ("12g", 2048, 512.0)
    assert cell.as_dict()["container"]["memory"] == "12g"  # recorded in run.json with the cell
    options = container_options("cpu", cell.container)
    assert options["mem_limit"] == "12g" and options["pids_limit"] == 2048 and options["network_mode"] == "none"
    assert options["nano_cpus"] == (os.cpu_count() or 1) * 10**9
    assert container_user(cell.container) == (UNPRIVILEGED_USER if os.geteuid() == 0
                                              else f"{os.getuid()}:{os.getgid()}")
    # the repository's own matrix confines every accelerator
    repo = load_matrix(Path(__file__).resolve().parents[1] / "matrix.toml")
    for acc in repo.accelerators.values():
        assert acc.container.memory and acc.container.pids and acc.container.cpus, acc.name
    for bad, why in (('memory = "lots"', "is not a size"), ("pids = -1", "whole number"),
                     ('user = "nobody"', "UID:GID"), ('network = "wifi"', "none, host, bridge"),
                     ("swap = 1", r"unknown key\(s\) swap")):
        with pytest.raises(MatrixError, match=why) as exc:
            load_matrix(_matrix(tmp_path, f"\n[accelerators.cpu.container]\n{bad}\n"))
        assert f"{tmp_path / 'matrix.toml'}:" in str(exc.value)


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("nox") is None, reason="nox is not installed")
def test_nox_matrix_json_prints_only_json_on_a_fresh_clones_first_run(tmp_path: Path) -> None:
    """`nox -s matrix -- --json | python -m json.tool` on a fresh clone: the first run
    installs the controller venv, and nothing of that reaches stdout."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(repo), str(clone)], check=True, timeout=120)
    # the working tree as it is (uncommitted edits included), so the test checks this code
    for name in ("noxfile.py", "pyproject.toml", "matrix.toml"):
        (clone / name).write_bytes((repo / name).read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOX", "VIRTUAL_ENV"))}
    proc = subprocess.run(["nox", "-s", "matrix", "--", "--json", "--tier", "nightly"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (clone / ".nox" / "_controller" / "bin" / "python").exists(), "the first run made the controller venv"
    data = json.loads(proc.stdout)  # only JSON: no pip or nox line before it
    assert data["include"] and all("cell" in entry for entry in data["include"])
    assert "pip" in proc.stderr or "nox >" in proc.stderr
