"""What `python -m distci run` prints: a line per finished test, the summary, the exit line.

Three promises to the person (or CI log) watching a run:

- Something arrives at least every 30 s. pytest's own progress dots do not end a line
  until a file is done, so a line-by-line relay shows nothing for minutes; instead the
  controller tails the run's results.jsonl (the harness appends one record per finished
  test) and prints one line per test as it finishes, and a heartbeat fills silences.
  pytest's output still goes to pytest.log, flushed as it arrives.
- Text is printed literally. Test ids carry brackets (`test_x[float32]`) and so do our
  tags (`[known pytorch-149990]`); nothing here goes through a markup interpreter.
- It reads at 80 columns: the cell id on its own line, the counts below it.

The exit code is one of EXIT_CODES and the last line names it, so a CI step that only
sees "failed" in nox's output still learns whether tests or infrastructure failed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, TextIO

from distci.run.progress import DEFAULT_INTERVAL_S, Heartbeat, StatusLine, format_duration
from distci.results import Result
from distci.rundir import CellRun, RunDir

Log = Callable[[str], None]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INFRA, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CODES = {
    EXIT_OK: "no test failed (passed, skipped or a known issue)",
    EXIT_FAILED: "a test failed (not explained by a known issue)",
    EXIT_USAGE: "a usage or configuration error (or a selection that chose no test)",
    EXIT_INFRA: "only infrastructure failed: no test failed, but a cell or suite could not run",
    EXIT_INTERRUPTED: "interrupted",
}
EXIT_FILE_ENV = "DISTCI_EXIT_FILE"

# A line of pytest's progress output: `path.py ..F.s  [ 40%]` or a continuation of dots.
_PROGRESS = re.compile(r"^(\S+\.py )?[.sSxXFEfpP]+ *(\[ *\d+%\])?$")


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


def write_exit_file(path: Path | str, code: int, runs: Iterable[CellRun]) -> None:
    """The exit code, its meaning and each run's directory as JSON, for a CI step to read."""
    data = {"exit_code": code, "meaning": EXIT_CODES.get(code, ""),
            "runs": [{"run_id": r.info.run_id, "cell_id": r.info.cell_id, "run_dir": str(r.run_dir),
                      "exit_code": exit_code([r])} for r in runs]}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")


def failed_ranks(r: Result) -> list[int]:
    return [x.rank for x in r.ranks if x.outcome not in ("passed", "skipped")]


def tag(r: Result) -> str:
    """`[known <id>]`, `[infra]` or `[<failure kind>]`: why a failure is what it is."""
    if r.failure_kind == "infra":
        return "[infra]"
    if r.known_issue:
        return f"[known {r.known_issue}]"
    return f"[{r.failure_kind or r.outcome}]"


def result_line(r: Result) -> str:
    """One finished test: outcome, time, id, and for a failure its tag and failing ranks."""
    line = f"{r.outcome.upper():7} {format_duration(r.duration_s):>6}  {r.test_id}"
    if r.outcome in ("failed", "error"):
        line += f"  {tag(r)}"
        ranks = failed_ranks(r)
        if ranks:
            line += f" rank {','.join(map(str, ranks))}"
    return line


class ResultTail:
    """New complete lines of a results.jsonl since the last call (the harness appends them)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
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


def relay_pytest(proc: subprocess.Popen, log_file: Path, results_file: Path, log: Log, *,
                 interval_s: float = DEFAULT_INTERVAL_S, poll_s: float = 0.5, status: StatusLine | None = None) -> int:
    """Waits for a pytest started with stdout=PIPE; returns its exit code.

    pytest's bytes go to `log_file` as they arrive (flushed); its complete lines go to
    `log` except the progress-dot lines, which say nothing a per-test line does not;
    each result the harness records becomes one `result_line`; and a heartbeat speaks
    when `interval_s` passes without any of these (and, given a terminal's `status`, a
    live line of the counts is redrawn in between).
    """
    assert proc.stdout is not None
    tail = ResultTail(results_file)
    lock = threading.Lock()
    with Heartbeat("tests", log, interval_s=interval_s, probe=lambda: (tail.count, None), status=status) as hb:
        say = hb.wrap(log)

        def drain() -> None:
            with lock:
                for r in tail.new():
                    say(result_line(r))

        def relay(line: str) -> None:
            drain()  # a finished test's line comes before pytest's report of it
            with lock:
                say(line)

        reader = threading.Thread(target=_copy_output, args=(proc.stdout, log_file, relay), daemon=True)
        reader.start()
        while reader.is_alive() or proc.poll() is None:
            drain()
            reader.join(poll_s)
        code = proc.wait()
        drain()
    return code


def _copy_output(stream, log_file: Path, log: Log) -> None:
    fd = stream.fileno()
    pending = b""
    with open(log_file, "wb") as out:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out.write(chunk)
            out.flush()
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                _relay(raw, log)
        if pending:
            _relay(pending, log)


def _relay(raw: bytes, log: Log) -> None:
    line = raw.decode("utf-8", "replace").rstrip()
    if line and not _PROGRESS.match(line):
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
            known=sum(bool(r.known_issue) and r.outcome in ("failed", "error") for r in rs),
            skipped=run.count("skipped"),
            infra=sum(r.failure_kind == "infra" for r in rs),
            seconds=sum(r.duration_s for r in rs),
        )

    def line(self) -> str:
        return (f"{self.passed} passed, {self.failed} failed, {self.known} known, {self.skipped} skipped, "
                f"{self.infra} infra, {format_duration(self.seconds)}")


def print_summary(runs: list[CellRun], out: TextIO | None = None) -> None:
    """Per cell: its id on one line, counts below, then every failure with its tag and repro."""
    out = out or sys.stdout

    def emit(text: str = "") -> None:
        out.write(text + "\n")

    emit()
    emit("distci results")
    emit("=" * 15)
    for run in runs:
        counts = Counts.of(run)
        state = "FAILED" if counts.failed else ("INFRA" if counts.infra else "OK")
        emit(f"{run.info.cell_id}")
        emit(f"  {state}: {counts.line()}")
        emit(f"  results: {_relative(RunDir(run.run_dir).results_path)}")
        for r in run.results:
            if r.outcome in ("failed", "error"):
                emit(f"  {r.outcome.upper()} {r.test_id}")
                emit(f"    {tag(r)} {r.error_signature or ''}".rstrip())
                if r.repro:
                    emit(f"    repro: {r.repro}")
        emit()
    out.flush()


def _relative(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)

