"""The run directory: the one module that knows its layout.

    <runs root>/<run id>/
        results.jsonl    one Result per line (distci.results), appended as each test ends,
                         never rewritten: the source of truth
        run.json         RunInfo: what the runner knows that the results do not say
        stack.json       the Stack the cell's pytest captured (distci.stack)
        junit.xml        JUnit, rewritten from results.jsonl by each runner when it ends
        pytest.log, provision.log, provision.json, ranks/   logs, for people

Every writer (cell runs, the harness, external suites, images, the aggregate) and every
reader (the store, run reports, bisect) goes through here, so the layout changes in one
place. Reading is damage-isolating: a line that is not a Result is reported with its
file:line and skipped, and the run's other lines still count.

Runs inside cell environments too (the harness records through it): standard library
and distci.results only; orjson, where it is installed (the controller), only makes reading
results.jsonl faster, with json's answers (`load_line`).
"""

from __future__ import annotations

import datetime
import io
import json
import os
import shlex
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

from distci.errors import StoreError
from distci.results import Result, error_signature, write_atomic, write_junit

try:
    import orjson
except ImportError:  # a cell environment: json alone
    orjson = None

RESULTS_FILE = "results.jsonl"
JUNIT_FILE = "junit.xml"
STACK_FILE = "stack.json"
RUN_FILE = "run.json"
PYTEST_LOG = "pytest.log"
PROVISION_LOG = "provision.log"
PROVISION_FILE = "provision.json"
RUN_FILES = (RESULTS_FILE, RUN_FILE, STACK_FILE, JUNIT_FILE)
"""The files that make a run: what a history keeps and an ingest reads."""

INFRA_PREFIX = "<infra>::"
RECORD_LOST_EXIT = 75
"""pytest's exit status (EX_TEMPFAIL) when the harness could not write a Result: the run is `infra`."""


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def utc(ts: str | None) -> str:
    """An ISO timestamp normalized to UTC so runs from many runners sort by string."""
    if not ts:
        return ""
    try:
        dt = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return ts
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.timezone.utc)
    return dt.astimezone(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunInfo:
    """run.json: what the runner knows about a run that its results do not say.

    `baseline_cell` is the cell this one is compared with when it has no history of its
    own (declared in matrix.toml; the runner copies it here so verdicts can be recomputed
    from the files alone). `ended_at` stays empty while the run goes: a run.json without
    it is a run in flight, or one whose controller died. `selection` is how the run was
    narrowed (`-k EXPR`, `--test ID`: see `selection_of`); empty for a run of the cell's
    whole suites. The gate takes the expected tests of a cell only from runs that were not
    narrowed; a narrowed run adds evidence for the tests it ran.
    """

    run_id: str
    cell_id: str
    started_at: str = ""
    ended_at: str = ""
    runner: str = ""
    backend: str = ""
    image_digest: str | None = None
    image: str | None = None
    tier: str = ""
    nightly_date: str | None = None
    baseline_cell: str | None = None
    cell: dict[str, Any] = field(default_factory=dict)
    pytest_exit: int | None = None
    command: str = ""
    ci: dict[str, str] = field(default_factory=dict)  # GitHub's run coordinates: the dashboard links the job
    exit_code: int | None = None  # this cell's part of `distci run`'s exit code (distci.run.terminal.EXIT_CODES)
    selection: list[str] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        """Whether the run ran a selection of the cell's tests rather than all of them."""
        return bool(self.selection)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunInfo":
        """Tolerates unknown keys (run.json grows) and nulls where text is expected."""
        out = cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        for f in fields(cls):
            if f.default == "" and getattr(out, f.name) is None:
                setattr(out, f.name, "")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LineProblem:
    """A line of results.jsonl that is not a Result: skipped, counted, reported."""

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


def parse_results(path: Path, problems: list[LineProblem] | None = None) -> Iterator[Result]:
    """The Results of a results.jsonl file (or of a run directory); see numbered_results."""
    for _, result in numbered_results(path, problems):
        yield result


def numbered_results(path: Path, problems: list[LineProblem] | None = None) -> Iterator[tuple[int, Result]]:
    """(line number, Result) of each good line of a results.jsonl file (or of a run directory).

    A line that does not decode, is not JSON, or is JSON but not a Result (`[1,2,3]`, an
    object with unknown fields or a bad outcome) is appended to `problems` (when given)
    and skipped: one bad line never hides the good ones. A torn last line (the writer
    died mid-write) is reported the same way.
    """
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    with open(path, "rb") as fh:
        yield from _numbered(path, fh, problems)


def _numbered(path: Path, lines: Iterable[bytes], problems: list[LineProblem] | None) -> Iterator[tuple[int, Result]]:
    """numbered_results over the lines of a file (or of its bytes, read once), as `path`."""
    for n, raw in enumerate(lines, 1):
        if raw.isspace() or not raw:
            continue
        try:
            data = load_line(raw)
        except UnicodeDecodeError as exc:
            reason = f"not UTF-8 ({exc.reason} at byte {exc.start})"
        except json.JSONDecodeError as exc:
            reason = f"not JSON ({exc.msg}, column {exc.colno})"
        else:
            try:
                yield n, Result.from_dict(data)
                continue
            except (TypeError, ValueError) as exc:
                reason = f"not a Result ({exc})"
        if problems is not None:
            problems.append(LineProblem(str(path), n, reason))


_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19
"""Digits enough for an integer past 64 bits, which orjson reads as a float and json as an
int: 19 zeros in the line with every digit made 0 (two C passes; a regex tries every byte)."""


def load_line(raw: bytes) -> Any:
    """`json.loads(raw.decode("utf-8"))`: the same value, or the same error. orjson (3x
    faster) answers where it agrees with json: a line it rejects (bad UTF-8, lone
    surrogates, NaN, a number past a double, nesting past 1024) or one with a run of 19
    digits (a big integer) is read by json, so its value or its error is json's."""
    if orjson is not None and _LONG_NUMBER not in raw.translate(_DIGITS):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw.decode("utf-8"))


def read_results(path: Path) -> list[Result]:
    """The good Results of a results.jsonl file or run directory (bad lines skipped)."""
    return list(parse_results(path))


class RecordError(OSError):
    """A Result could not be written (a full disk, a file-size limit). results.jsonl still
    ends with its last whole record; the run must end as `infra`, not as test failures."""

    def __init__(self, path: Path, test_id: str, cause: OSError) -> None:
        super().__init__(cause.errno, f"cannot record {test_id} in {path}: {cause.strerror or cause} "
                                      f"(results so far are kept whole; free space or raise the limit, then rerun)")
        self.path, self.test_id = path, test_id


class RunDir:
    """One run directory: where each of its files is, and the writes every runner does."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, runs_root: Path, run_id: str) -> "RunDir":
        path = Path(runs_root).resolve() / run_id
        path.mkdir(parents=True)
        return cls(path)

    results_path = property(lambda self: self.path / RESULTS_FILE)
    junit_path = property(lambda self: self.path / JUNIT_FILE)
    stack_path = property(lambda self: self.path / STACK_FILE)
    info_path = property(lambda self: self.path / RUN_FILE)
    pytest_log = property(lambda self: self.path / PYTEST_LOG)
    provision_log = property(lambda self: self.path / PROVISION_LOG)
    provision_file = property(lambda self: self.path / PROVISION_FILE)

    def append(self, result: Result) -> None:
        """One durable line per Result: flushed and fsync'd, so a crash loses nothing finished.

        A write that fails (a full disk, a file-size limit) is undone to the last whole
        record and raised as RecordError: the file never holds a torn line."""
        self.path.mkdir(parents=True, exist_ok=True)
        line = (json.dumps(result.to_dict(), sort_keys=True, default=str) + "\n").encode("utf-8")
        with open(self.results_path, "ab", buffering=0) as fh:
            end = fh.seek(0, os.SEEK_END)
            try:
                view = memoryview(line)
                while view:
                    view = view[fh.write(view):]
                os.fsync(fh.fileno())
            except OSError as exc:
                try:
                    fh.truncate(end)
                except OSError:
                    pass
                raise RecordError(self.results_path, result.test_id, exc) from exc

    def append_closing(self, results: list[Result], suite_name: str) -> OSError | None:
        """Appends a run's closing Results (infra records) and rewrites junit.xml; on a full
        disk returns the error instead of raising: the caller still reports them."""
        try:
            for result in results:
                self.append(result)
            self.write_junit(suite_name)
        except OSError as exc:
            return exc
        return None

    def results(self, problems: list[LineProblem] | None = None) -> list[Result]:
        return list(parse_results(self.results_path, problems)) if self.results_path.exists() else []

    def write_junit(self, suite_name: str) -> Path:
        """junit.xml from everything results.jsonl holds (every runner's Results)."""
        return write_junit(self.results(), self.junit_path, suite_name=suite_name)

    def write_info(self, info: RunInfo) -> None:
        """run.json, replaced atomically: a reader sees the old or the new one, never half."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.info_path, json.dumps(info.to_dict(), indent=1, sort_keys=True, default=str).encode())

    def read_info(self) -> RunInfo | None:
        try:
            data = json.loads(self.info_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return RunInfo.from_dict(data) if isinstance(data, dict) and "run_id" in data and "cell_id" in data else None

    def write_stack(self, stack: Any, *, keep: bool = False) -> None:
        """stack.json; `keep` leaves one that a runner before this one wrote."""
        if keep and self.stack_path.exists():
            return
        data = stack.to_dict() if hasattr(stack, "to_dict") else stack
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.stack_path, json.dumps(data, indent=1, sort_keys=True, default=str).encode())

    def read_stack(self) -> dict[str, Any] | None:
        """The Stack the run captured, if it got that far."""
        try:
            data = json.loads(self.stack_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


def selection_of(tests: Iterable[str] | None, keyword: str | None, shard: str | None = None) -> list[str]:
    """The narrowing of a run as run.json records it: `-k EXPR`, each selected test id, then
    `--shard K/N` (a share of the tier: distci.judge.coverage joins the N shards)."""
    from distci.run.shards import SHARD_PREFIX

    return ([f"-k {keyword}"] if keyword else []) + list(tests or []) + ([SHARD_PREFIX + shard] if shard else [])


def repro_line(cell_id: str | None, test_id: str | None = None, *, backend: str | None = None) -> str:
    """The command that reruns a cell (or one test of it): printed and stored with every failure."""
    if not cell_id:
        return f"python -m pytest -p distci.harness.plugin {shlex.quote(test_id or '')}".rstrip()
    cmd = f"nox -s dist_tests -- --cell {cell_id}"
    if test_id:
        cmd += f" --test {shlex.quote(test_id)}"
    if backend and backend != "venv":
        cmd += f" --backend {backend}"
    return cmd


def infra_result(
    run_id: str,
    cell_id: str,
    message: str,
    *,
    exc_type: str = "InfraError",
    log: str = "",
    stack: dict[str, Any],
    test_id: str | None = None,
    log_path: Path | None = None,
    backend: str | None = None,
) -> Result:
    """An `infra` Result: for the whole cell (`<infra>::<cell id>`), or for `test_id`.

    Rule 2 of the design: it carries the cell id and a stack (the captured one when the
    environment came up, else the partial one the caller builds) and the log tail.
    """
    return Result(
        run_id=run_id,
        cell_id=cell_id,
        test_id=test_id or f"{INFRA_PREFIX}{cell_id}",
        outcome="error",
        failure_kind="infra",
        error_signature=error_signature(exc_type, message),
        message=f"{exc_type}: {message}\n{log}"[:20000],
        stack=stack,
        repro=repro_line(cell_id, test_id, backend=backend),
        started_at=now(),
        log_path=str(log_path) if log_path else "",
    )


def find_run_dirs(paths: Iterable[Path]) -> list[Path]:
    """Run directories under the given paths: a run directory itself, or any parent of many."""
    found: set[Path] = set()
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise StoreError("no such file or directory", where=str(p))
        if p.is_file():
            p = p.parent
        for root, dirs, files in os.walk(p):
            dirs.sort()
            if RESULTS_FILE in files or RUN_FILE in files:
                found.add(Path(root))
    return sorted(found)


class RunDirError(ValueError):
    """A run directory that cannot be read as one run (reported by path, never fatal to others)."""

    def __init__(self, message: str, where: Path, problems: list[LineProblem] | None = None) -> None:
        super().__init__(f"{where}: {message}")
        self.where = str(where)
        self.problems = list(problems or [])


@dataclass
class RunContents:
    """A run directory read from disk: its info, stack, good Results and the bad lines skipped.

    `raw` is results.jsonl's bytes (the append-only check compares prefixes of it);
    `meta` is stack.json and run.json's bytes (a change of either re-indexes the run).
    """

    path: Path
    info: RunInfo
    stack: dict[str, Any]
    results: list[Result]
    problems: list[LineProblem]
    raw: bytes
    meta: bytes


def _derive_info(run_dir: Path, results: list[Result]) -> RunInfo:
    """A RunInfo for a run without run.json, from its results."""
    first = results[0] if results else None
    starts = sorted(utc(r.started_at) for r in results if r.started_at)
    ends = []
    for r in results:
        try:
            t = datetime.datetime.fromisoformat(utc(r.started_at)).timestamp() + r.duration_s
        except ValueError:
            continue
        ends.append(datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds"))
    return RunInfo(
        run_id=first.run_id if first else run_dir.name,
        cell_id=first.cell_id if first else "",
        started_at=starts[0] if starts else "",
        ended_at=max(ends) if ends else "",
    )


def read_run(run_dir: Path) -> RunContents:
    """Reads one run directory consistently, or raises RunDirError naming what is wrong.

    Results of another run or cell than the run's own are problems of their lines, not
    of the run. The results file is re-read until two reads agree (a run still appending).
    """
    run_dir = Path(run_dir)
    rd = RunDir(run_dir)
    for _ in range(5):
        raw = rd.results_path.read_bytes() if rd.results_path.exists() else b""
        problems: list[LineProblem] = []
        results = list(_numbered(rd.results_path, io.BytesIO(raw), problems))
        after = rd.results_path.read_bytes() if rd.results_path.exists() else b""
        if after == raw:
            break
        time.sleep(0.05)
    else:
        raise RunDirError(f"{RESULTS_FILE} keeps changing while it is read", run_dir)
    try:
        return _read_meta(rd, results, problems, raw)
    except RunDirError as exc:
        exc.problems = problems + exc.problems
        raise


def _read_meta(rd: RunDir, numbered: list[tuple[int, Result]], problems: list[LineProblem],
               raw: bytes) -> RunContents:
    run_dir = rd.path
    results = [r for _, r in numbered]
    meta = b""
    stack: dict[str, Any] = {}
    if rd.stack_path.exists():
        meta += rd.stack_path.read_bytes()
        stack = _json_object(rd.stack_path)
    elif results:
        stack = dict(results[0].stack)
    if rd.info_path.exists():  # its times win; only the ids default to the results' (no pass over them)
        meta += b"\0" + rd.info_path.read_bytes()
        first = results[0] if results else None
        info = RunInfo.from_dict({"run_id": first.run_id if first else run_dir.name,
                                  "cell_id": first.cell_id if first else "", **_json_object(rd.info_path)})
    else:
        info = _derive_info(run_dir, results)
    if not info.run_id or not info.cell_id:
        raise RunDirError("run has no run id or cell id (no run.json and no readable result)", run_dir)
    kept = []
    for n, r in numbered:
        if r.run_id != info.run_id or r.cell_id != info.cell_id:
            problems.append(LineProblem(str(rd.results_path), n, f"result {r.test_id} belongs to run {r.run_id} "
                                        f"of cell {r.cell_id}, not run {info.run_id} of cell {info.cell_id}"))
            continue
        kept.append(r)
    info.started_at = utc(info.started_at) or min((utc(r.started_at) for r in kept if r.started_at), default="")
    info.ended_at = utc(info.ended_at)
    if info.image_digest is None:
        info.image_digest = stack.get("image_digest")
    return RunContents(run_dir, info, stack, kept, problems, raw, meta)


def _json_object(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RunDirError(f"not valid JSON ({exc})", path) from exc
    if not isinstance(data, dict):
        raise RunDirError("not a JSON object", path)
    return data


@dataclass
class CellRun:
    info: RunInfo
    run_dir: Path
    results: list[Result]
    selection_error: str = ""
    """Set when pytest selected no test (exit 5): a typo in -k / --test is an error, not a green run."""

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.results)

    @property
    def infra(self) -> bool:
        return any(r.failure_kind == "infra" for r in self.results)

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.outcome in ("failed", "error") and r.failure_kind != "infra"
                and not r.known_issue]
