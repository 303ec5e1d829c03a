"""What `python -m distci run` prints: per-test lines as tests finish, heartbeats in
silences, an 80-column summary with literal test ids and tags, and a named exit code."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from distci.run.cellrun import RunInfo

from distci.rundir import CellRun
from distci.run.progress import Heartbeat, StatusLine, Tick, installed_probe
from distci.results import RankExcerpt, Result
from distci.run.terminal import (EXIT_CODES, EXIT_FAILED, EXIT_INFRA, EXIT_OK, exit_code, exit_line, print_summary,
                             relay_pytest, result_line)

CELL = "cuda-cu130-torch_nightly-ao_nightly-ws2-fix_on"
MARKUP_ID = "suites/test_float8.py::test_f8[[bold]float32[/bold]-rowwise]"


def _r(test_id: str, outcome: str = "passed", **kw) -> Result:
    return Result(run_id="r1", cell_id=CELL, test_id=test_id, outcome=outcome, stack={}, **kw)


def _run(results: list[Result], tmp_path: Path) -> CellRun:
    return CellRun(RunInfo(run_id="r1", cell_id=CELL, started_at=""), tmp_path / "r1", results)


def test_summary_prints_ids_and_tags_literally_within_80_columns(tmp_path: Path) -> None:
    results = [
        _r("suites/test_tp.py::test_tp[colwise]", duration_s=3.0),
        _r(MARKUP_ID, "failed", failure_kind="exception", known_issue="pytorch149990-rowwise-upcast",
           error_signature="RuntimeError: [red]scale[/red] mismatch", repro="nox -s dist_tests -- --cell X"),
        _r("suites/test_tp.py::test_tp[sp]", "failed", failure_kind="hang",
           ranks=[RankExcerpt(0, "passed"), RankExcerpt(1, "failed")]),
        _r("suites/test_x.py::test_skip", "skipped"),
    ]
    out = io.StringIO()
    print_summary([_run(results, tmp_path)], out)
    text = out.getvalue()
    assert MARKUP_ID in text and "[known pytorch149990-rowwise-upcast]" in text
    assert "RuntimeError: [red]scale[/red] mismatch" in text and "[hang]" in text
    lines = text.splitlines()
    assert CELL in lines, "the cell id stands on its own line"
    counts = lines[lines.index(CELL) + 1]
    assert counts == "  FAILED: 1 passed, 1 failed, 1 known, 1 skipped, 0 infra, 3s" and len(counts) <= 80
    assert result_line(results[2]).endswith("[hang] rank 1")


def test_exit_code_names_tests_before_infrastructure(tmp_path: Path) -> None:
    infra = _r("<infra>::" + CELL, "error", failure_kind="infra")
    known = _r("t::known", "failed", failure_kind="assert", known_issue="k")
    real = _r("t::real", "failed", failure_kind="assert")
    assert exit_code([_run([known], tmp_path)]) == EXIT_OK
    assert exit_code([_run([infra], tmp_path), _run([known], tmp_path)]) == EXIT_INFRA
    assert exit_code([_run([infra], tmp_path), _run([real], tmp_path)]) == EXIT_FAILED
    assert exit_line(EXIT_INFRA) == f"distci: exit 3: {EXIT_CODES[3]}" and "infrastructure" in EXIT_CODES[3]


def test_heartbeat_speaks_only_into_silence() -> None:
    now = [100.0]
    lines: list[str] = []
    hb = Heartbeat("installing", lines.append, interval_s=15.0, probe=lambda: (3, 12), clock=lambda: now[0])
    say = hb.wrap(lines.append)
    for _ in range(6):  # a step that talks every 10 s leaves the heartbeat nothing to say
        now[0] += 10.0
        say("working")
        assert not hb.poll()
    now[0] += 14.9
    assert not hb.poll()
    now[0] += 0.2
    assert hb.poll() and lines[-1] == "installing: still running after 1m15s, 3/12, about 3m45s left"
    now[0] += 15.0
    assert hb.poll() and hb.ticks == 2 and lines.count("working") == 6


def test_terminal_status_line_is_redrawn_and_cleared_before_each_line() -> None:
    now = [0.0]
    screen = io.StringIO()
    lines: list[str] = []
    hb = Heartbeat("installing", lines.append, interval_s=15.0, probe=lambda: (4, 17), clock=lambda: now[0],
                   status=StatusLine(screen, "[cell] "))
    now[0] = 2.0
    assert not hb.poll() and screen.getvalue() == "\r\x1b[K[cell] installing: still running after 2s, 4/17, about 6s left"
    hb.wrap(lines.append)("pip: done")
    assert screen.getvalue().endswith("\r\x1b[K") and lines == ["pip: done"]
    now[0] = 20.0
    assert hb.poll() and lines[-1].startswith("installing: still running after 20s")


def test_heartbeat_thread_fills_a_real_silence() -> None:
    lines: list[str] = []
    with Heartbeat("downloading", lines.append, interval_s=0.3) as hb:
        time.sleep(1.5)
    assert hb.ticks >= 2 and all(m.startswith("downloading: still running after") for m in lines)


def test_tick_eta_and_install_probe(tmp_path: Path) -> None:
    assert Tick("x", 60.0, 3, 12).eta_s() == 180.0 and Tick("x", 60.0, 0, 12).eta_s() is None
    assert Tick("x", 125.0, 5, None).line() == "x: still running after 2m05s, 5 so far"
    old = tmp_path / "old-env" / "lib" / "python3.12" / "site-packages"
    old.mkdir(parents=True)
    for i in range(20):
        (old / f"pkg{i}-1.0.dist-info").mkdir()
    os.utime(tmp_path / "old-env", (1, 1))
    site = tmp_path / "new-env" / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    for name in ("torch-2.13.0.dist-info", "numpy-2.0.dist-info", "torch"):
        (site / name).mkdir()
    assert installed_probe(tmp_path, 17)() == (2, 17), "the venv being built: the newest"


# A child that behaves as pytest with the harness does: progress dots without a newline,
# one results.jsonl record per finished test (through distci.rundir, as the recorder
# writes them), a silence, then its report. Standard library only, so it starts fast.
CHILD = """
import sys, time
from distci.results import Result
from distci.rundir import RunDir
w = RunDir(sys.argv[1])
print("collected 2 items"); sys.stdout.write("t.py ."); sys.stdout.flush()
w.append(Result(run_id="r", cell_id="c", test_id="t.py::test_first", outcome="passed", stack={}, duration_s=0.1))
time.sleep(2.5)
w.append(Result(run_id="r", cell_id="c", test_id="t.py::test_slow[[bold]x[/bold]]", outcome="failed", stack={},
               failure_kind="assert", duration_s=2.5))
print("F [100%]"); print("FAILED t.py::test_slow - [bold]not markup[/bold]")
sys.exit(1)
"""


def test_relay_prints_each_test_as_it_finishes_and_beats_in_silence(tmp_path: Path) -> None:
    """Each finished test reaches the log while the child still runs, the heartbeat fills
    the silence, the child's bytes fill pytest.log as they come, progress dots are dropped."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    lines: list[tuple[float, str, int]] = []
    log_file = run_dir / "pytest.log"

    def log(m: str) -> None:
        lines.append((time.monotonic(), m, log_file.stat().st_size if log_file.exists() else 0))

    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    code = relay_pytest(proc, log_file, run_dir / "results.jsonl", log, interval_s=1.0, poll_s=0.1)
    ended = time.monotonic()
    assert code == 1
    text = [m for _, m, _ in lines]
    first = text.index("PASSED      0s  t.py::test_first")
    failed = text.index("FAILED      2s  t.py::test_slow[[bold]x[/bold]]  [assert]")
    beats = [i for i, m in enumerate(text) if m.startswith("tests: still running after")]
    assert any(first < b < failed for b in beats), text
    assert ended - lines[first][0] > 2.0, "test_first was printed when it finished, not when the child ended"
    assert lines[first][2] > 0, "pytest.log had the child's first bytes before it ended"
    assert failed < text.index("FAILED t.py::test_slow - [bold]not markup[/bold]"), "a test's line precedes the report"
    assert "collected 2 items" in text and not any("[100%]" in m or m.startswith("t.py .") for m in text)
    assert log_file.read_text().startswith("collected 2 items\nt.py .F [100%]")


KNOWN = '''
[[issue]]
id = "distci-literal-known-break"
title = "a failure the registry explains"
tests = ["tests/harness_cases/test_literal.py::test_known_break*"]
signature = "upstream break"
upstream = ""
'''


@pytest.mark.slow
def test_run_at_80_columns_shows_counts_known_tag_and_exit_code(tmp_path: Path) -> None:
    """`python -m distci run` on the CPU cell (the env test_cellrun provisions is reused)."""
    from test_cellrun import DEFAULT_CELL

    (tmp_path / "known.toml").write_text(KNOWN)
    env = {**os.environ, "COLUMNS": "80", "DISTCI_EXIT_FILE": str(tmp_path / "exit.json")}
    proc = subprocess.run(
        [sys.executable, "-m", "distci", "run", "--cell", DEFAULT_CELL, "--runs-root", str(tmp_path / "runs"),
         "--known-issues", str(tmp_path / "known.toml"), "--test", "tests/harness_cases/test_literal.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    tid = "tests/harness_cases/test_literal.py::test_known_break[[bold]float32[/bold]]"
    assert f"[{DEFAULT_CELL}] FAILED " in out and tid in out
    assert out.index(f"[{DEFAULT_CELL}] PASSED ") < out.index("= FAILURES ="), "per-test lines as tests finish"
    summary = out[out.index("distci results"):].splitlines()
    assert summary[summary.index(DEFAULT_CELL) + 1] == "  OK: 1 passed, 0 failed, 1 known, 0 skipped, 0 infra, " + \
        summary[summary.index(DEFAULT_CELL) + 1].rsplit(", ", 1)[1]
    assert f"  ERROR {tid}" in summary or f"  FAILED {tid}" in summary
    assert any(line.startswith("    [known distci-literal-known-break] RuntimeError: upstream break [red]")
               for line in summary)
    assert out.rstrip().splitlines()[-1] == exit_line(0)
    assert json.loads((tmp_path / "exit.json").read_text())["exit_code"] == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["exit_code"] == 0
