"""Honest answers: a flaky boundary is confirmed or called flaky, a timeout is its own
outcome, an infra skip is retried, swapped endpoints are called swapped.

Engine properties use plain functions as probes; the CLI cases run `distci bisect` over a
git repository made here (a pure-Python package, one commit per change).
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from distci import cli
from distci.bisect import BisectState, ProbeOutcome, bisect
from distci.bisect.engine import CONFIRM_RUNS
from distci.bisect.args import BisectArgs, parse_bisect
from distci.bisect.report import format_result, result_to_dict

from test_bisect_git import PYPROJECT, Repo


@pytest.fixture(autouse=True)
def _archive(tmp_path, monkeypatch):
    """Probes download into the wheelhouse archive: a test's own, not the checkout's."""
    monkeypatch.setenv("DISTCI_WHEELHOUSE_ROOT", str(tmp_path / "wheelhouse"))
    monkeypatch.setenv("DISTCI_ENV_ROOT", str(tmp_path / "envs"))


class Flaky:
    """Candidates below `boundary` are good, from it on bad, except that `liar` answers
    the wrong way on its `lie_on`-th call (1-based)."""

    def __init__(self, boundary: int, liar: int, lie_on: int) -> None:
        self.boundary, self.liar, self.lie_on = boundary, liar, lie_on
        self.calls: dict[int, int] = {}

    def __call__(self, c: int) -> str:
        self.calls[c] = self.calls.get(c, 0) + 1
        truth = "bad" if c >= self.boundary else "good"
        if c == self.liar and self.calls[c] == self.lie_on:
            return "good" if truth == "bad" else "bad"
        return truth


def test_a_lucky_first_run_next_to_the_boundary_is_caught_by_the_confirmation():
    # candidate 11 is bad but answers good once: without confirmation the engine names 12
    fooled = bisect(range(32), Flaky(boundary=11, liar=11, lie_on=1))
    assert fooled.kind == "boundary" and fooled.first_bad == 12  # what --no-confirm risks
    result = bisect(range(32), Flaky(boundary=11, liar=11, lie_on=1), confirm=True)
    assert result.kind == "flaky"
    assert result.flaky.key == "11" and result.flaky.outcomes == ["good", "bad"]
    assert "11 is flaky: 2 runs answered good, bad" in format_result(result)


def test_confirmation_gives_each_side_fresh_runs_and_agrees_with_a_steady_probe():
    probe = Flaky(boundary=11, liar=-1, lie_on=0)
    events = []
    result = bisect(range(32), probe, confirm=True, on_event=events.append)
    assert (result.kind, result.last_good, result.first_bad) == ("boundary", 10, 11)
    # the search's run of each side, then CONFIRM_RUNS fresh ones: never the run it confirms alone
    assert probe.calls[10] == probe.calls[11] == 1 + CONFIRM_RUNS
    assert sum(n > 1 for n in probe.calls.values()) == 2
    confirming = [str(e).split(": ")[0] for e in events if "[confirm]" in str(e) and e.outcome]
    assert confirming == [f"step 7 of about 7 [confirm] {c}" for c in (10, 11) for _ in range(CONFIRM_RUNS)]
    assert {r.key: r.phase for r in result.probes}["10"] == "bisect"  # the record keeps why it began


def test_two_lies_in_a_row_no_longer_pass_the_confirmation():
    """The case of issue 41: the search's lie, then one more, passed `repeats + 1`."""
    calls = {}

    def probe(c: int) -> str:
        calls[c] = calls.get(c, 0) + 1
        truth = "bad" if c >= 11 else "good"
        return "good" if c == 11 and calls[c] <= 2 else truth

    assert bisect(range(32), probe, confirm=1).first_bad == 12  # what confirming with one run risked
    calls.clear()
    result = bisect(range(32), probe, confirm=True)
    assert result.kind == "flaky" and result.flaky.key == "11"
    assert result.flaky.outcomes[:2] == ["good", "good"] and "bad" in result.flaky.outcomes


def test_a_timeout_is_counted_and_shown_and_steps_around_as_a_skip():
    def probe(c: int) -> ProbeOutcome:
        if c == 5:
            return ProbeOutcome("skip", detail="timeout after 2s", reason="timeout")
        return ProbeOutcome("bad" if c >= 5 else "good")

    result = bisect(range(10), probe)
    assert result.kind == "range" and [*result.range] == [5, 6]
    assert result.reasons == {"timeout": 1}
    assert "timeout: 1 runs" in format_result(result)
    assert result_to_dict(result)["reasons"] == {"timeout": 1}


def test_an_infra_skip_is_not_replayed_from_the_state(tmp_path):
    state_path = tmp_path / "state.json"
    broken = {3}

    def probe(c: int) -> ProbeOutcome:
        if c in broken:
            return ProbeOutcome("skip", detail="build failed", reason="infra")
        return ProbeOutcome("bad" if c >= 3 else "good")

    first = bisect(range(8), probe, state=BisectState.open(state_path))
    assert first.kind == "range"
    broken.clear()  # the builder was fixed
    again = bisect(range(8), probe, state=BisectState.open(state_path))
    assert (again.kind, again.first_bad) == ("boundary", 3)
    resumed = {r.key: r.resumed for r in again.probes}
    assert resumed["3"] is False and resumed["7"] is True


def test_the_resume_line_reproduces_every_option():
    args = BisectArgs(command="python check.py", good="v1", bad="v2", axis="torchao", repo="ao",
                      build_env=["USE_CPP=0"], builder="/x/python", base_env="venv", timeout=30.0,
                      on_timeout="bad", confirm=0, repeats=2, fresh=True)
    argv = args.to_argv()
    assert argv[0] == "commits" and "--fresh" not in argv
    for flag in ("--builder", "--build-env", "--base-env", "--repo", "--timeout", "--on-timeout",
                 "--no-confirm", "--repeats"):
        assert flag in argv
    warned = []
    parsed, _ = parse_bisect(argv, warn=warned.append)
    assert parsed == BisectArgs(**{**args.__dict__, "fresh": False, "source": "git"}) and not warned


def test_each_mode_is_a_subcommand_with_only_its_options_and_the_old_flags_still_parse():
    for mode, flag in (("python-diff", "--repo"), ("versions", "--check-requires"), ("list", "--good"),
                       ("commits", "--wheelhouse")):
        with pytest.raises(SystemExit):
            parse_bisect([mode, flag, "x"])
    pydiff = BisectArgs(command="python c.py", good="2.14.0", bad="2.14.1", mode="python-diff",
                        check_requires=["numpy"], repeats=3)
    assert pydiff.to_argv()[:1] == ["python-diff"] and "--python-diff" not in pydiff.to_argv()
    assert parse_bisect(pydiff.to_argv())[0] == pydiff
    warned = []
    old, _ = parse_bisect(["--command", "python c.py", "--good", "2.14.0", "--bad", "2.14.1", "--python-diff",
                           "--check-requires", "numpy", "--repeats", "3"], warn=warned.append)
    assert old == pydiff
    assert len(warned) == 1 and "deprecated" in warned[0] and "distci bisect python-diff" in warned[0]
    test_id, _ = parse_bisect(["below-nightly", "t.py::test_x", "--good", "2026-11-19", "--bad", "2026-11-21"])
    assert (test_id.mode, test_id.test_id) == ("below-nightly", "t.py::test_x")


# -- through the CLI, over a git repository ---------------------------------------------


@pytest.fixture
def tagged_repo(tmp_path):
    """v1 good, v2 bad (2 commits apart), `scale` reads a build-time flag: DEMO_FLAG=1 at
    build time makes every commit good (a changed input must change the answers)."""
    repo = Repo(tmp_path / "demo")
    setup = ("import os\nfrom setuptools import setup\n"
             "open('src/gdemo/_flag.py', 'w').write(f\"FLAG = {os.environ.get('DEMO_FLAG', '0')!r}\\n\")\n"
             "setup()\n")
    body = "from gdemo._flag import FLAG\n\ndef scale(x):\n    return 2 * x if FLAG == '1' else {expr}\n"
    repo.commit("v1", {"pyproject.toml": PYPROJECT.format(n=1), "setup.py": setup,
                       "src/gdemo/__init__.py": body.format(expr="2 * x")})
    repo.git("tag", "v1")
    repo.commit("refactor", {"README": "x"})
    repo.commit("break", {"src/gdemo/__init__.py": body.format(expr="x + x + (x == 3)")})
    repo.commit("docs", {"README": "y"})
    repo.git("tag", "v2")
    return repo


CHECK = "python -c 'import sys, gdemo; sys.exit(0 if gdemo.scale(3) == 6 else 1)'"


def _bisect(tmp_path, repo, *extra: str) -> tuple[int, str]:
    argv = ["bisect", "--command", CHECK, "--axis", "gdemo", "--repo", str(repo.path),
            "--builder", sys.executable, "--cache", str(tmp_path / "cache"),
            "--out", str(tmp_path / "out"), *extra]
    return cli.main(argv), ""


@pytest.mark.slow
def test_a_changed_build_env_is_another_question_and_swapped_endpoints_are_called_swapped(
        tagged_repo, tmp_path, capsys):
    code, _ = _bisect(tmp_path, tagged_repo, "--good", "v1", "--bad", "v2")
    out = capsys.readouterr().out
    assert code == 0 and re.search(r"first bad: [0-9a-f]{40}", out)
    assert "[confirm]" in out and "assumes one flip" in out
    # the commits mode names the culprit's subject and where to compare it, as the nightly modes do
    culprit = tagged_repo.git("rev-parse", "v2~1")
    assert f"first bad commit: {culprit[:12]} break" in out
    assert f"compare: git -C {tagged_repo.path} log --first-parent {tagged_repo.git('rev-parse', 'v2~2')}..{culprit}" in out
    tagged_repo.git("remote", "add", "origin", "git@github.com:pytorch/ao.git")
    code, _ = _bisect(tmp_path, tagged_repo, "--good", "v1", "--bad", "v2")
    assert f"compare: https://github.com/pytorch/ao/compare/{tagged_repo.git('rev-parse', 'v2~2')}...{culprit}" in (
        capsys.readouterr().out)
    resume = re.search(r"rerun: (.+)\)$", out, re.MULTILINE).group(1)
    assert "--builder" in resume and "--repo" in resume

    code, _ = _bisect(tmp_path, tagged_repo, "--good", "v1", "--bad", "v2")
    assert "from state" in capsys.readouterr().out  # the same question: answered from state (a remote is no input)

    # another build env: the same commits build other wheels, answered anew (here: the
    # endpoints no longer differ)
    code, _ = _bisect(tmp_path, tagged_repo, "--good", "v1", "--bad", "v2", "--build-env", "DEMO_FLAG=1")
    captured = capsys.readouterr()
    assert code == 2 and "endpoints do not differ" in captured.err
    assert "from state" not in captured.out

    assert cli.main(["bisect", "--command", CHECK, "--axis", "gdemo", "--repo", str(tagged_repo.path),
                     "--good", "v2", "--bad", "v1", "--builder", sys.executable,
                     "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "the endpoints are swapped" in err and "with --find-fix" in err


@pytest.mark.slow
def test_timeout_is_a_skip_by_default_and_shown_in_the_summary(tagged_repo, tmp_path, capsys):
    slow = "python -c 'import sys, time, gdemo; r = gdemo.scale(3); r == 7 and time.sleep(30); sys.exit(r != 6)'"
    argv = ["bisect", "--command", slow, "--axis", "gdemo", "--repo", str(tagged_repo.path),
            "--good", "v1", "--bad", "v2", "--builder", sys.executable, "--timeout", "8",
            "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    assert re.search(r"could not be probed \(skip: timeout after 8", capsys.readouterr().err)
    report = json.loads(next((tmp_path / "out").rglob("report-*.json")).read_text())
    assert report["reasons"] == {"timeout": 1}
    assert any(r["runs"][0]["reason"] == "timeout" and r["outcome"] == "skip" for r in report["probes"])
