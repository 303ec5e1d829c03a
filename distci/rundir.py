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
and distci.results only (which reads each line: `numbered_lines`).
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
from distci.results import LineProblem, Result, numbered_lines, write_atomic, write_junit
from distci.stack import Stack

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


KEYWORD_PREFIX, SHARD_PREFIX, RESUME_PREFIX = "-k ", "--shard ", "--resume "


def parse_shard(text: str) -> tuple[int, int]:
    """(K, N) of a shard given as `K/N` (1 <= K <= N): the K-th of N shares of a tier's tests
    (`distci run --shard`, the suites' `--distci-shard`: N jobs run one cell's tier side by side)."""
    k, sep, n = text.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise ValueError(f"shard {text!r} is not K/N with 1 <= K <= N (e.g. --shard 1/2)")
    return int(k), int(n)


@dataclass(frozen=True)
class Selection:
    """How a run was narrowed: run.json's `selection`, written and read only through here.

    On disk, a list of words in this order: `-k EXPR`, each selected test id, `--shard K/N`,
    then `--resume RUN_ID` per run it resumes; empty for a run of the cell's whole tier. The
    gate takes a cell's expected tests only from runs not narrowed (or narrowed by their
    shard alone: distci.judge.coverage joins the N shares); a run that resumes others
    completes with them (distci.run.resume)."""

    keyword: str | None = None
    tests: tuple[str, ...] = ()
    shard: str | None = None
    resumes: tuple[str, ...] = ()

    def to_list(self) -> list[str]:
        return ([KEYWORD_PREFIX + self.keyword] if self.keyword else []) + list(self.tests) + (
            [SHARD_PREFIX + self.shard] if self.shard else []) + [RESUME_PREFIX + r for r in self.resumes]

    @classmethod
    def from_list(cls, words: Iterable[str] | None) -> "Selection":
        keyword, tests, shard, resumes = None, [], None, []
        for word in words or ():
            if word.startswith(KEYWORD_PREFIX) and keyword is None:
                keyword = word[len(KEYWORD_PREFIX):]
            elif word.startswith(SHARD_PREFIX) and shard is None:
                shard = word[len(SHARD_PREFIX):]
            elif word.startswith(RESUME_PREFIX):
                resumes.append(word[len(RESUME_PREFIX):])
            else:
                tests.append(word)
        return cls(keyword, tuple(tests), shard, tuple(resumes))

    @property
    def narrowed(self) -> bool:
        """Whether the run's own selection (beyond the runs it resumes) narrows its tier."""
        return bool(self.keyword or self.tests or self.shard)

    @property
    def share(self) -> tuple[int, int] | None:
        """(K, N) of a run narrowed by its shard alone (the K-th share of its tier), else None."""
        if self.keyword or self.tests or not self.shard:
            return None
        try:
            return parse_shard(self.shard)
        except ValueError:
            return None


@dataclass
class RunInfo:
    """run.json: what the runner knows about a run that its results do not say.

    `baseline_cell` is the cell this one is compared with when it has no history of its
    own (declared in matrix.toml; the runner copies it here so verdicts can be recomputed
    from the files alone). `ended_at` stays empty while the run goes: a run.json without
    it is a run in flight, or one whose controller died. `selection` is how the run was
    narrowed, in its on-disk words (`Selection`, the one reader and writer of them); empty
    for a run of the cell's whole suites. The gate takes the expected tests of a cell only from runs that were not
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
    def selected(self) -> Selection:
        return Selection.from_list(self.selection)

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
        yield from numbered_lines(path, fh, problems)


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

    def write_stack(self, stack: Stack, *, keep: bool = False) -> None:
        """stack.json; `keep` leaves one that a runner before this one wrote."""
        if keep and self.stack_path.exists():
            return
        data = stack.to_dict()
        self.path.mkdir(parents=True, exist_ok=True)
        write_atomic(self.stack_path, json.dumps(data, indent=1, sort_keys=True, default=str).encode())

    def read_stack(self) -> Stack | None:
        """The Stack the run captured, if it got that far."""
        try:
            data = json.loads(self.stack_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return Stack.from_dict(data) if isinstance(data, dict) else None


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
    stack: Stack
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
        results = list(numbered_lines(rd.results_path, io.BytesIO(raw), problems))
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
    stack = Stack.from_dict({})
    if rd.stack_path.exists():
        meta += rd.stack_path.read_bytes()
        stack = Stack.from_dict(_json_object(rd.stack_path))
    elif results:
        stack = results[0].stack
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
        info.image_digest = stack.image_digest
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
