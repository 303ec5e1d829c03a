"""What `python -m distci run` prints: a line per finished test, the summary, the exit line.

Three promises to the person (or CI log) watching a run:

- Something arrives at least every 30 s. pytest's own progress dots do not end a line
  until a file is done, so a line-by-line relay shows nothing for minutes; instead the
  controller tails the run's results.jsonl (the harness appends one record per finished
  test) and prints one line per test as it finishes, and a heartbeat fills silences.
  pytest's output still goes to pytest.log, flushed as it arrives.
- Text is printed literally. Test ids carry brackets (`test_x[float32]`) and so do our
  tags (`[known pytorch-149990]`); nothing here goes through a markup interpreter.
- It reads at COLUMNS (80 when unknown): every line `run` writes is fitted to the width
  (`fitted_output`), ids shortened from the middle so the file and the parametrization
  stay; the cell id stands on its own line, lines about it carry a short `[cell] ` tag;
  pytest is told the width left after that tag, so its own separators fit too.
- One word per outcome everywhere: a failure the known-issues registry explains is
  KNOWN on its per-test line, in the summary and in the counts, never FAILED; one whose
  environment failed is INFRA. One duration format (format_duration) per run: pytest's
  closing `in 1189.23s (0:19:49)` is relayed as `in 19m49s`. pytest's DEBUG log lines
  (its captured-log sections) stay in pytest.log.

The exit code is one of EXIT_CODES and the last line names it, so a CI step that only
sees "failed" in nox's output still learns whether tests or infrastructure failed
(under nox, `.nox/distci-exit.json`: distci.command).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import select
import shlex
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, TextIO

from distci.results import format_duration
from distci.run.fitting import columns, command_lines, short_run_id, shorten, shorten_test_id, wrap
from distci.run.progress import DEFAULT_INTERVAL_S, Heartbeat, StatusLine
from distci.results import Result
from distci.rundir import CellRun, RunDir, utc

Log = Callable[[str], None]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INFRA, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CODES = {
    EXIT_OK: "no test failed (passed, skipped or a known issue)",
    EXIT_FAILED: "a test failed (not explained by a known issue)",
    EXIT_USAGE: "a usage or configuration error (or a selection that chose no test)",
    EXIT_INFRA: "only infrastructure failed: no test failed, but a cell or suite could not run",
    EXIT_INTERRUPTED: "interrupted",
}

# A line of pytest's progress output: `path.py ..F.s  [ 40%]` or a continuation of dots.
_PROGRESS = re.compile(r"^(\S+\.py )?[.sSxXFEfpP]+ *(\[ *\d+%\])?$")
# pytest's collection line: `collected 42 items / 30 deselected / 12 selected` (or `collected 1 item`).
_COLLECTED = re.compile(r"^collected (\d+) items?(?: / (\d+) deselected)?(?: / (\d+) selected)?")
# A log record as pytest shows captured logs (`DEBUG    name:file.py:12 text`), a rank's prefix allowed.
_DEBUG = re.compile(r"^(\[[^\]]*\]:?\s*)?DEBUG\b")
# pytest's closing line: `==== 1 failed, 41 passed in 1189.23s (0:19:49) ====`.
_PYTEST_TIME = re.compile(r" in (\d+(?:\.\d+)?)s(?: \(\d+:\d\d:\d\d\))?(?= =+$|$)")

class FittedStream:
    """A text stream that keeps each line it is given within a width.

    Lines the terminal formats itself (per-test lines, the summary) already fit, their
    ids shortened from the middle; anything longer that reaches the stream (a relayed
    traceback line, an install error) is wrapped, not cut: what it says may be the only
    clue, and the CI log keeps all of it. Writes that start with `\\r` (a StatusLine
    redraw, which cuts itself) pass through.
    """

    def __init__(self, stream: TextIO, width: int) -> None:
        self.stream = stream
        self.width = width
        self._pending = ""

    def write(self, text: str) -> int:
        if text.startswith("\r") and not self._pending:
            self.stream.write(text)
            return len(text)
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self.stream.write("\n".join(wrap(line, self.width)) + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self.stream.write("\n".join(wrap(self._pending, self.width)))
            self._pending = ""
        self.stream.flush()

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextmanager
def fitted_output(width: int | None = None) -> Iterator[int]:
    """Within the block, every line printed to stdout and stderr fits `width` (default:
    columns()); yields the width."""
    width = width or columns()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = FittedStream(sys.stdout, width), FittedStream(sys.stderr, width)
    try:
        yield width
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = saved


def exit_code(runs: Iterable[CellRun]) -> int:
    """1 when a test failed, else 2 when a selection chose no test, else 3 when something
    could not run, else 0."""
    runs = list(runs)
    if any(r.failed for r in runs):
        return EXIT_FAILED
    if any(getattr(r, "selection_error", "") for r in runs):
        return EXIT_USAGE
    if any(r.infra for r in runs):
        return EXIT_INFRA
    return EXIT_OK


def exit_line(code: int) -> str:
    return f"distci: exit {code}: {EXIT_CODES.get(code, 'unknown exit code')}"


def run_records(runs: Iterable[CellRun]) -> list[dict]:
    """Each run's id, cell, directory and exit code: what the exit file lists of a `run`."""
    return [{"run_id": r.info.run_id, "cell_id": r.info.cell_id, "run_dir": str(r.run_dir),
             "exit_code": exit_code([r])} for r in runs]


def failed_ranks(r: Result) -> list[int]:
    return [x.rank for x in r.ranks if x.outcome not in ("passed", "skipped")]


def is_known(r: Result) -> bool:
    """A failure the known-issues registry explains (verdict xfail): KNOWN, never FAILED."""
    return bool(r.known_issue) and r.outcome in ("failed", "error") and r.failure_kind != "infra"


def label(r: Result) -> str:
    """The one word for a test's outcome, the same on its line, in the summary and the counts."""
    if r.failure_kind == "infra":
        return "INFRA"
    if is_known(r):
        return "KNOWN"
    return r.outcome.upper()


def tag(r: Result) -> str:
    """`[known <id>]`, `[infra]` or `[<failure kind>]`: why a failure is what it is."""
    if r.failure_kind == "infra":
        return "[infra]"
    if r.known_issue:
        return f"[known {r.known_issue}]"
    return f"[{r.failure_kind or r.outcome}]"


MIN_ID_CHARS = 40  # a test id keeps this much before a known issue's id is shortened
MIN_WHY_CHARS = 12  # a known issue's id shorter than this is left out (the summary names it)


def result_line(r: Result, width: int | None = None) -> str:
    """One finished test: label, time, id, and for a failure why (the known issue's id,
    or the failure kind) and its failing ranks; within `width` (unbounded by default).

    The test id is shortened from the middle only when it must be, after the tag."""
    head = f"{label(r):7} {format_duration(r.duration_s):>6}  "
    why = ""
    if r.outcome in ("failed", "error"):
        why = f"[{r.known_issue}]" if is_known(r) else tag(r)
        ranks = failed_ranks(r)
        if ranks:
            why += f" rank {','.join(map(str, ranks))}"
        why = "  " + why
    if width is None or len(head) + len(r.test_id) + len(why) <= width:
        return head + r.test_id + why
    room = width - len(head)
    if why and not is_known(r) and room - len(why) < MIN_ID_CHARS:
        why = f"  {tag(r)}"  # the failing ranks go first (the summary and the rank logs have them)
    if is_known(r):  # KNOWN already says it; the issue's id gets what the test id leaves
        left = room - max(min(len(r.test_id), MIN_ID_CHARS), room - len(why))
        why = shorten(why, left) if left >= MIN_WHY_CHARS else ""
    return head + shorten_test_id(r.test_id, max(MIN_WHY_CHARS, room - len(why))) + why


class ResultTail:
    """New complete lines of a results.jsonl since the last call (the harness appends them).

    It starts where the file ends when it is made: a run directory may already hold the
    results of earlier pytest sessions (a `--resume`, a fuzz run's sweeps and batches), and
    those are neither this session's lines to print nor its progress to count ("5/2")."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.offset = self.path.stat().st_size
        except FileNotFoundError:
            self.offset = 0
        self.count = 0

    def new(self) -> list[Result]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for raw in data[:end].splitlines():
            try:
                out.append(Result.from_dict(json.loads(raw)))
            except (ValueError, TypeError):
                continue
        self.count += len(out)
        return out


def selected(line: str) -> int | None:
    """How many tests pytest's collection line says will run, or None for another line."""
    m = _COLLECTED.match(line)
    if not m:
        return None
    collected, deselected, chosen = (int(g) if g else None for g in m.groups())
    return chosen if chosen is not None else collected - (deselected or 0)


def relay_pytest(proc: subprocess.Popen, log_file: Path, results_file: Path, log: Log, *,
                 interval_s: float = DEFAULT_INTERVAL_S, poll_s: float = 0.5, status: StatusLine | None = None,
                 width: int | None = None) -> int:
    """Waits for a pytest started with stdout=PIPE; returns its exit code.

    pytest's bytes go to `log_file` as they arrive (flushed); its complete lines go to
    `log` except the progress-dot lines, which say nothing a per-test line does not,
    and DEBUG log records; each result the harness records becomes one `result_line`
    (within `width`); and a heartbeat speaks when `interval_s` passes without any of
    these, with done/total (the total from pytest's `collected ... selected` line) and
    an ETA (and, given a terminal's `status`, a live line of the counts is redrawn in
    between).
    """
    assert proc.stdout is not None
    tail = ResultTail(results_file)
    lock = threading.Lock()
    copying = threading.Lock()  # held by the reader from reading pytest's bytes until they are in log_file
    total: list[int | None] = [None]

    def probe() -> tuple[int, int | None]:
        return tail.count, total[0]

    with Heartbeat("tests", log, interval_s=interval_s, probe=probe, status=status) as hb:
        say = hb.wrap(log)

        def drain() -> None:
            with lock:
                for r in tail.new():
                    say(result_line(r, width))

        def drain_after_output() -> None:
            """The main loop's drain: pytest writes a test's output before the harness
            records its result, so while pytest's bytes are still unread (in the pipe, or
            read and not yet in `log_file`) its results wait for the reader, which drains
            them itself when it relays the next line."""
            with copying:
                if select.select([proc.stdout], [], [], 0)[0]:
                    return
                drain()

        def relay(line: str) -> None:
            drain()  # a finished test's line comes before pytest's report of it
            chosen = selected(line)
            if chosen is not None:
                total[0] = chosen
            with lock:
                say(_PYTEST_TIME.sub(lambda m: f" in {format_duration(float(m.group(1)))}", line))

        reader = threading.Thread(target=_copy_output, args=(proc.stdout, log_file, relay, copying), daemon=True)
        reader.start()
        while reader.is_alive() or proc.poll() is None:
            if reader.is_alive():
                drain_after_output()
            else:
                drain()
            reader.join(poll_s)
        code = proc.wait()
        drain()
    return code


def _copy_output(stream, log_file: Path, log: Log, copying: threading.Lock | None = None) -> None:
    """pytest's bytes into `log_file` as they come, its lines to `log`. `copying` is held from
    the read until the bytes are flushed (relay_pytest's main loop waits on it); lines are
    relayed after it is released."""
    fd = stream.fileno()
    pending = b""
    copying = copying or threading.Lock()
    with open(log_file, "wb") as out:
        while True:
            select.select([fd], [], [])
            with copying:
                chunk = os.read(fd, 65536)
                if chunk:
                    out.write(chunk)
                    out.flush()
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                _relay(raw, log)
        if pending:
            _relay(pending, log)


def _relay(raw: bytes, log: Log) -> None:
    line = raw.decode("utf-8", "replace").rstrip()
    if line and not _PROGRESS.match(line) and not _DEBUG.match(line):
        log(line)


@dataclass
class Counts:
    passed: int
    failed: int
    known: int
    skipped: int
    infra: int
    seconds: float

    @classmethod
    def of(cls, run: CellRun) -> "Counts":
        rs = run.results
        return cls(
            passed=run.count("passed"),
            failed=len(run.failed),
            known=sum(is_known(r) for r in rs),
            skipped=run.count("skipped"),
            infra=sum(r.failure_kind == "infra" for r in rs),
            seconds=wall_seconds(run),
        )

    def line(self) -> str:
        return (f"{self.passed} passed, {self.failed} failed, {self.known} known, {self.skipped} skipped, "
                f"{self.infra} infra, {format_duration(self.seconds)} wall")


def wall_seconds(run: CellRun) -> float:
    """How long the run took by the clock, from its start to its end (now while it goes):
    the one duration a run has. The sum of its tests' times is not it (a run's setup,
    collection and environment are in no test, and shares run side by side)."""
    def parse(ts: str) -> datetime.datetime | None:
        try:
            return datetime.datetime.fromisoformat(utc(ts)) if ts else None
        except ValueError:
            return None

    start = parse(run.info.started_at)
    if start is None:
        return sum(r.duration_s for r in run.results)
    end = parse(run.info.ended_at) or datetime.datetime.now(datetime.timezone.utc)
    return max(0.0, (end - start).total_seconds())


def print_summary(runs: list[CellRun], out: TextIO | None = None, width: int | None = None) -> None:
    """Per cell: its id on one line, counts below, then every failure (KNOWN ones too) with
    its tag and repro; every line within `width` (default: columns())."""
    out = out or sys.stdout
    width = width or columns()

    def emit(text: str = "") -> None:
        out.write("\n".join(wrap(text, width)) + "\n")

    emit()
    emit("distci results")
    emit("=" * 15)
    for run in runs:
        counts = Counts.of(run)
        state = "FAILED" if counts.failed else ("INFRA" if counts.infra else "OK")
        emit(shorten(run.info.cell_id, width))
        emit(f"  {state}: {counts.line()}")
        emit(f"  results: {results_path(run, width - len('  results: '))}")
        for r in run.results:
            if r.outcome in ("failed", "error"):
                emit(f"  {label(r)} {shorten_test_id(r.test_id, width - 3 - len(label(r)))}")
                emit(f"    {tag(r)} {r.error_signature or ''}".rstrip())
                if r.repro:
                    emit("    repro:")
                    for line in _repro_lines(r.repro, width, "      "):
                        out.write(line + "\n")  # fitted by construction; a wrap would break the paste
        emit()
    out.flush()


def _repro_lines(repro: str, width: int, indent: str) -> list[str]:
    """A repro command as pasteable lines within `width` (as it is, if it is not shell words)."""
    try:
        words = shlex.split(repro)
    except ValueError:
        return [indent + repro]
    return command_lines(words, width, indent=indent, prompt="")


def results_path(run: CellRun, width: int) -> str:
    """The run's results.jsonl, relative when under the current directory; past `width`,
    the run id's cell part (printed above it) becomes `*`: a glob a shell still opens."""
    path = _relative(RunDir(run.run_dir).results_path)
    if len(path) > width:
        path = path.replace(run.info.run_id, short_run_id(run.info.run_id, run.info.cell_id, 0), 1)
    return path


def _relative(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)

