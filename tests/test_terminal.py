"""What `python -m distci run` prints: per-test lines as tests finish, heartbeats in
silences, an 80-column summary with literal test ids and tags, and a named exit code."""

from __future__ import annotations

import io
import json
import os
import shlex
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
from distci.run.terminal import (EXIT_CODES, EXIT_FAILED, EXIT_INFRA, EXIT_OK, FittedStream, exit_code,
                                 exit_line, print_summary, relay_pytest, result_line, selected)
from distci.run.fitting import CELL_TAG_CHARS, cell_tag, shorten, shorten_test_id

CELL = "cuda-cu130-torch_nightly-ao_nightly-ws2-fix_on"
MARKUP_ID = "suites/test_float8.py::test_f8[[bold]float32[/bold]-rowwise]"


def _r(test_id: str, outcome: str = "passed", **kw) -> Result:
    return Result(run_id="r1", cell_id=CELL, test_id=test_id, outcome=outcome, stack={}, **kw)


def _run(results: list[Result], tmp_path: Path) -> CellRun:
    return CellRun(RunInfo(run_id="r1", cell_id=CELL, started_at="2026-12-06T00:00:00+00:00",
                           ended_at="2026-12-06T00:00:44+00:00"), tmp_path / "r1", results)


LONG_ID = "suites/regressions/test_pytorch149990_rowwise_float8_upcast.py::test_grads[rowwise-bf16-compile-ac-ws2]"


def test_summary_prints_ids_and_tags_literally_within_80_columns(tmp_path: Path) -> None:
    results = [
        _r("suites/test_tp.py::test_tp[colwise]", duration_s=3.0),
        _r(MARKUP_ID, "failed", failure_kind="exception", known_issue="pytorch149990-rowwise-upcast",
           error_signature="RuntimeError: [red]scale[/red] mismatch", repro="nox -s dist_tests -- --cell X"),
        _r("suites/test_tp.py::test_tp[sp]", "failed", failure_kind="hang",
           ranks=[RankExcerpt(0, "passed"), RankExcerpt(1, "failed")]),
        _r("suites/test_x.py::test_skip", "skipped"),
        _r(LONG_ID, "failed", failure_kind="assert", error_signature="AssertionError: " + "loss differs " * 12,
           repro=f"nox -s dist_tests -- --cell {CELL} --test {LONG_ID}"),
    ]
    out = io.StringIO()
    print_summary([_run(results, tmp_path)], out, width=80)
    text = out.getvalue()
    assert MARKUP_ID in text and "[known pytorch149990-rowwise-upcast]" in text
    assert "RuntimeError: [red]scale[/red] mismatch" in text and "[hang]" in text
    lines = text.splitlines()
    assert max(map(len, lines)) <= 80, [line for line in lines if len(line) > 80]
    assert CELL in lines, "the cell id stands on its own line"
    assert lines[lines.index(CELL) + 1] == "  FAILED: 1 passed, 2 failed, 1 known, 1 skipped, 0 infra, 44s wall", \
        "one duration per run: the clock's, not the sum of the tests' 3 s"
    assert f"  KNOWN {MARKUP_ID}" in lines and f"  FAILED {MARKUP_ID}" not in lines, "a known issue is KNOWN"
    assert "  FAILED suites/test_tp.py::test_tp[sp]" in lines
    assert "loss differs " * 4 in text.replace("\n    ", " "), "a long signature is wrapped, never cut"
    pasted = [shlex.split(_command_at(lines, i + 1)) for i, line in enumerate(lines) if line == "    repro:"]
    assert ["nox", "-s", "dist_tests", "--", "--cell", CELL, "--test", LONG_ID] in pasted, "the repro stays pasteable"
    assert result_line(results[2]).endswith("[hang] rank 1")


def _command_at(lines: list[str], start: int) -> str:
    """The shell command that starts at lines[start], as a shell joins its continuations."""
    text = lines[start]
    while text.endswith("\\"):
        start += 1
        text = text[:-1] + "\n" + lines[start]
    return text.replace("\n", "")


def test_per_test_lines_fit_80_columns_and_say_known_for_a_known_issue() -> None:
    tag = cell_tag(CELL)
    assert tag == "[cuda-tnt-aont-ws2-on] " and len(tag) <= CELL_TAG_CHARS + 3
    width = 80 - len(tag)
    known = _r(MARKUP_ID, "failed", failure_kind="exception", known_issue="pytorch149990-rowwise-upcast",
               duration_s=62.0)
    assert result_line(known, 120) == f"KNOWN    1m02s  {MARKUP_ID}  [pytorch149990-rowwise-upcast]"
    line = result_line(known, width)
    assert len(line) <= width and line.startswith("KNOWN    1m02s  te")
    assert line.endswith("[[bold]float32[/bold]-rowwise]"), "the parametrization stays whole"
    long = _r(LONG_ID, "failed", failure_kind="assert", duration_s=3.0,
              ranks=[RankExcerpt(0, "failed"), RankExcerpt(1, "failed")])
    line = result_line(long, width)
    assert len(line) <= width and line.startswith("FAILED      3s  te") and "::te" in line
    assert line.endswith("-compile-ac-ws2]  [assert]"), "the parametrization's tail and the failure kind are kept"
    assert result_line(long, 120).endswith("  [assert] rank 0,1")
    infra = _r("<infra>::" + CELL, "error", failure_kind="infra")
    assert result_line(infra, width).startswith("INFRA       0s  <infra>::") and len(result_line(infra, width)) <= width
    assert shorten("abcdefghij", 7) == "a...hij" and shorten("abc", 7) == "abc"


def test_a_passing_line_never_carries_a_failure_tag_however_narrow() -> None:
    passed = _r(LONG_ID, "passed", duration_s=3.0)
    for width in (40, 50, 64):
        line = result_line(passed, width)
        assert len(line) <= width and line.startswith("PASSED") and "[passed]" not in line, line
        assert line.endswith("-ac-ws2]"), "the room a failure's tag would take goes to the id"


def test_a_cell_tag_keeps_the_versions_that_tell_nightly_cells_apart() -> None:
    tags = {cell_tag(f"cpu-cpu-torch_{v}-ao_0.18.0-ws2-fix_{m}") for v in ("2.13.0", "2.14.1", "2.15.0")
            for m in ("on", "off")}
    assert len(tags) == 6, "every version and fixes mode stays in the tag"
    assert cell_tag("cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off") == "[cpu-t2.13.0-ao0.18.0-ws2-off] "
    assert "t2.14.1" in cell_tag("cuda-cu130-torch_2.14.1-ao_0.18.0-titan_0.3.0-ws2-fix_on")
    assert cell_tag("some-other-shape") == "[some-other-shape] "


@pytest.mark.parametrize("width", range(24, 130, 7))
def test_a_shortened_test_id_keeps_file_stem_function_and_parametrization_as_far_as_it_can(width: int) -> None:
    short = shorten_test_id(LONG_ID, width)
    assert len(short) <= width
    if width >= len(LONG_ID):
        assert short == LONG_ID
    elif width >= len("test_pytorch149990_rowwise_float8_upcast::test_grads[rowwise-bf16-compile-ac-ws2]"):
        assert "suites/" not in short, "the root goes first"
        assert short.replace(".py", "").endswith(
            "test_pytorch149990_rowwise_float8_upcast::test_grads[rowwise-bf16-compile-ac-ws2]")
    elif width >= len("test_p...st::t...s[rowwise-bf16-compile-ac-ws2]"):
        stem, _, rest = short.partition("::")
        assert stem.startswith("test_") and stem.endswith("upcast"), short
        assert rest.endswith("[rowwise-bf16-compile-ac-ws2]") and rest.startswith("t"), short


def test_fitted_stream_wraps_what_it_did_not_format_and_lets_status_redraws_through() -> None:
    screen = io.StringIO()
    stream = FittedStream(screen, 40)
    stream.write("short line\n" + "word " * 20 + "\n")
    stream.write("\r\x1b[K[cell] tests: 3/12")
    stream.write("unterminated " * 5)
    stream.flush()
    lines = screen.getvalue().replace("\r\x1b[K[cell] tests: 3/12", "").splitlines()
    assert lines[0] == "short line" and max(map(len, lines)) <= 40
    assert " ".join(" ".join(lines[1:]).split()) == " ".join(["word"] * 20 + ["unterminated"] * 5), "nothing is lost"
    assert "\r\x1b[K[cell] tests: 3/12" in screen.getvalue()


def test_selected_reads_pytests_collection_line() -> None:
    assert selected("collected 42 items") == 42 and selected("collected 1 item") == 1
    assert selected("collected 42 items / 30 deselected / 12 selected") == 12
    assert selected("collected 42 items / 2 deselected") == 40 and selected("PASSED t.py::x") is None


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
print("F [100%]"); print("---- Captured log call ----")
print("DEBUG    torch.distributed:c10d.py:12 rank 0 says hello")
print("FAILED t.py::test_slow - [bold]not markup[/bold]")
print("==== 1 failed, 1 passed in 62.41s (0:01:02) ====")
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

    # An earlier session's results in the same run directory (a resume, a fuzz run's sweeps):
    # neither printed again nor counted as this session's progress.
    from distci.results import Result
    from distci.rundir import RunDir

    RunDir(run_dir).append(Result(run_id="r", cell_id="c", test_id="t.py::test_earlier", outcome="passed", stack={},
                                  duration_s=0.1))
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
    assert not any("test_earlier" in m for m in text), "an earlier session's result is not this session's line"
    assert all(", 1/2, about " in text[b] and text[b].endswith(" left") for b in beats if first < b < failed), \
        "the heartbeat counts against pytest's collected total, with an ETA"
    assert not any("DEBUG" in m for m in text), "DEBUG log lines stay in pytest.log"
    assert "==== 1 failed, 1 passed in 1m02s ====" in text, "one duration format"
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
    wide = [line for line in (out + proc.stderr).splitlines() if len(line) > 80]
    assert not wide, wide
    tid = "tests/harness_cases/test_literal.py::test_known_break[[bold]float32[/bold]]"
    tag = cell_tag(DEFAULT_CELL)
    assert f"cell {DEFAULT_CELL}" in out.splitlines(), "the full cell id has its own line"
    known = [line for line in out.splitlines() if line.startswith(f"{tag}KNOWN ")]
    assert len(known) == 1 and f"{tag}FAILED " not in out, known
    shortened = result_line(Result(run_id="r", cell_id=DEFAULT_CELL, test_id=tid, outcome="failed", stack={},
                                   known_issue="k"), 80 - len(tag)).rsplit("  ", 1)[-1]
    assert known[0].endswith(shortened) and shortened.endswith("[[bold]float32[/bold]]"), "id shortened, kept"
    assert out.index(f"{tag}PASSED ") < out.index("= FAILURES ="), "per-test lines as tests finish"
    assert "DEBUG" not in out
    summary = out[out.index("distci results"):].splitlines()
    assert summary[summary.index(DEFAULT_CELL) + 1] == "  OK: 1 passed, 0 failed, 1 known, 0 skipped, 0 infra, " + \
        summary[summary.index(DEFAULT_CELL) + 1].rsplit(", ", 1)[1]
    assert [line for line in summary if line.startswith("  KNOWN tests/harness_ca") and line.endswith("[/bold]]")], \
        "the summary says KNOWN, as the count does"
    assert not [line for line in summary if line.startswith("  FAILED ")]
    assert any(line.startswith("    [known distci-literal-known-break] RuntimeError: upstream break [red]")
               for line in summary)
    assert out.rstrip().splitlines()[-1] == exit_line(0)
    exit_file = json.loads((tmp_path / "exit.json").read_text())
    assert exit_file["command"] == "run" and exit_file["exit_code"] == 0 and exit_file["runs"][0]["exit_code"] == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["exit_code"] == 0
