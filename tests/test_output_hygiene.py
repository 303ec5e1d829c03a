"""Hostile or odd text in what distci hands to other systems (issue 28, Build 7):
$GITHUB_OUTPUT entries, Slack mrkdwn, and the matrix JSON on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jobsteps import _read_outputs

from distci.ci.actions import output_lines, write_outputs
from distci.judge.notify import _message, code, gate_message, link, mrkdwn, regressions_message
from distci.judge.store import ResultRow

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
