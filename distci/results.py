"""Outcome records: one Result per test per run, written as JSONL and JUnit.

The JSONL file of a run is the source of truth: it is appended to while the run goes
(one line per finished test, flushed and fsync'd, so a crash loses nothing already
finished) and never rewritten afterwards. The SQLite store and the dashboard are
indexes over these files. JUnit is written alongside for CI systems that read it.
Where these files live, and appending them, is distci.rundir's job; what a line of
results.jsonl is (a Result, or a LineProblem) is this module's (`numbered_lines`).

This module runs inside cell environments too (the harness writes results), so it uses
the standard library only; orjson, where it is installed (the controller), only makes
reading results.jsonl faster, with json's answers (`load_line`).
"""

from __future__ import annotations

import copy
import json
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

from distci.stack import SUMMARY_KEYS, Stack

try:
    import orjson
except ImportError:  # a cell environment: json alone
    orjson = None

SCHEMA_VERSION = 1

OUTCOMES = ("passed", "failed", "error", "skipped")
FAILURE_KINDS = ("assert", "exception", "timeout", "hang", "crash", "infra")


@dataclass
class RankExcerpt:
    """What one rank said about a test: its own outcome and the tail of its log."""

    rank: int
    outcome: str
    excerpt: str = ""


@dataclass
class Result:
    """One test's outcome in one run of one cell, with full provenance.

    `outcome` is what happened; the verdict (what it means against history and known
    issues) is computed later by distci.judge.verdicts and is not part of this record, except
    `known_issue`, the id of the registry entry the harness matched, if any.
    """

    run_id: str
    cell_id: str
    test_id: str
    outcome: str
    stack: Stack  # a dict (a JSONL record's) is read with Stack.from_dict
    failure_kind: str | None = None
    error_signature: str | None = None
    message: str = ""
    duration_s: float = 0.0
    reruns: int = 0
    rerun_outcomes: list[str] = field(default_factory=list)
    rerun_messages: list[str] = field(default_factory=list)
    ranks: list[RankExcerpt] = field(default_factory=list)
    repro: str = ""
    known_issue: str | None = None
    started_at: str = ""
    log_path: str = ""
    load: dict[str, Any] | None = None  # a timeout's runner load (machine.runner_load) and what was done about it
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {OUTCOMES}")
        if self.failure_kind is not None and self.failure_kind not in FAILURE_KINDS:
            raise ValueError(f"failure_kind {self.failure_kind!r} is not one of {FAILURE_KINDS}")
        if not self.cell_id:
            raise ValueError("a Result needs its cell id")
        if not isinstance(self.stack, Stack):
            self.stack = Stack.from_dict(self.stack)
        if self.ranks:
            self.ranks = [r if isinstance(r, RankExcerpt) else RankExcerpt(**r) for r in self.ranks]

    def to_dict(self) -> dict[str, Any]:
        """The JSONL record: every field, the stack as its own JSON object (Stack.to_dict)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if f.name == "stack" else (
                [asdict(r) for r in value] if f.name == "ranks" else copy.deepcopy(value))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Result":
        """A Result from one JSONL record; anything else (not an object, an unknown or
        missing field, a bad outcome) is a TypeError / ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise TypeError(f"a Result is a JSON object, not {type(data).__name__}")
        try:  # the names checked only when construction fails: ingest reads every line of a year
            return cls(**data)
        except TypeError:
            unknown = data.keys() - (_RESULT_FIELDS if cls is Result else {f.name for f in fields(cls)})
            if unknown:
                raise TypeError(f"unknown field(s) {', '.join(sorted(unknown))}") from None
            raise

    @property
    def attempts(self) -> list[tuple[str, str]]:
        """(outcome, message) of the first try and each rerun, in order."""
        messages = [self.message, *self.rerun_messages]
        tries = [self.outcome, *self.rerun_outcomes]
        return [(o, messages[i] if i < len(messages) else "") for i, o in enumerate(tries)]

    @property
    def flaky(self) -> bool:
        """Passed on one try and failed on another in this run."""
        tries = {o for o, _ in self.attempts}
        return "passed" in tries and bool(tries & {"failed", "error"})


_RESULT_FIELDS = frozenset(f.name for f in fields(Result))


def format_duration(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`, `4d11h`: the one way a run writes a duration (a test's, a
    heartbeat's, a provisioning step's), short enough for an 80-column line."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 2 * 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"

_SIGNATURE_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r"(?:/[\w.+-]+)+/([\w.+-]+\.py)"), r"\1"),
    (re.compile(r"\[rank\d+\]:?"), ""),
    (re.compile(r"\brank \d+\b"), "rank N"),
    (re.compile(r"line \d+"), "line N"),
    (re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])"), "N"),
    (re.compile(r"\s+"), " "),
)


INTERRUPTED = "Interrupted: "
"""How the error signature of the test in flight when a run was stopped starts (the
harness's recorder writes it): such a run did not run its whole selection."""


def is_interruption(error_signature: str | None) -> bool:
    return bool(error_signature) and error_signature.startswith(INTERRUPTED)


_WRAPPED_TRACEBACK = "Traceback (most recent call last)"


def headline(message: str) -> str:
    """The line of a failure message that names its error, as it was (numbers and all).

    That is the first non-blank line, unless the message wraps tracebacks: a first line
    followed at once by a traceback is a wrapper's generic headline (DCP's
    `CheckpointException ranks:dict_keys([0, 1])` before each failing rank's traceback,
    torch.multiprocessing's `-- Process 0 terminated with the following error:`), the same
    for every error it wraps, so the headline is the error line that ends the first
    wrapped traceback (its lowest rank's own error).
    """
    lines = [line for line in message.splitlines() if line.strip()]
    if len(lines) > 1 and lines[1].lstrip().startswith(_WRAPPED_TRACEBACK):
        inner = next((line for line in lines[2:] if not line[:1].isspace()
                      and not line.startswith(_WRAPPED_TRACEBACK)), None)
        if inner is not None:
            return inner.strip()
    return lines[0].strip() if lines else ""


def error_signature(exc_type: str, message: str) -> str:
    """A stable one-line key for a failure, so one bug groups across cells and nights.

    Addresses, numbers (shapes, timings, ranks), line numbers and directory prefixes
    change between runs of the same bug; they are normalized away. Only the message's
    headline counts (its first line, or the wrapped error's line, see `headline`).
    """
    text = headline(message)
    for pattern, repl in _SIGNATURE_RULES:
        text = pattern.sub(repl, text)
    return f"{exc_type}: {text.strip()}"[:300]


def stack_summary(stack: Stack) -> dict[str, str]:
    """The few stack fields worth a JUnit property on every testcase."""
    return {k: str(stack.get(k)) for k in SUMMARY_KEYS if stack.get(k)}


def test_location(test_id: str, root: Path | None = None) -> tuple[str, int]:
    """(file, line) of a test id for JUnit: the file part of the node id, and the line of
    its `def` when the file is found under `root` (0 when it is not: external suites,
    environment records)."""
    path, _, rest = test_id.partition("::")
    name = rest.rpartition("::")[2].split("[", 1)[0]
    if root is None or not name or path.startswith("<"):
        return path, 0
    try:
        text = (Path(root) / path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return path, 0
    m = re.search(rf"^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}\b", text, re.MULTILINE)
    return path, (text.count("\n", 0, m.start()) + 1) if m else 0


_XML_ILLEGAL = re.compile("[^\u0009\u000a\u000d\u0020-\u007e\u0080-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: object) -> str:
    """Text XML 1.0 can hold, escaped the way pytest's junitxml does (`bin_xml_escape`): a
    character XML forbids (NUL, ESC, BEL, a lone surrogate from undecodable bytes) becomes
    `#xHH` / `#xHHHH`, so one odd byte in a rank's output never makes junit.xml unreadable."""
    def repl(m: re.Match[str]) -> str:
        i = ord(m.group())
        return f"#x{i:02X}" if i <= 0xFF else f"#x{i:04X}"

    return _XML_ILLEGAL.sub(repl, str(text))


def _element(parent: ET.Element, tag: str, text: str | None = None, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, {k: xml_text(v) for k, v in attrs.items()})
    if text is not None:
        el.text = xml_text(text)
    return el


def _junit_kind(r: Result, verdict: str | None = None) -> str:
    """How a Result shows in JUnit, agreeing with the gate: known issues are skipped
    (pytest.xfail), a pass on a rerun passes (with its flaky failures), infra is an error.
    With the store's `verdict` (ingest rewrites JUnit from it), the verdict decides: an
    `xfail` is skipped with its known issue, a `flaky` failure is a flakyFailure."""
    if verdict is not None:
        if verdict == "xfail":
            return "xfail"
        if verdict == "flaky" and r.outcome in ("failed", "error"):
            return "flaky"
        return "flaky" if r.flaky else r.outcome
    if r.outcome == "failed" and r.known_issue:
        return "xfail"
    if r.flaky:
        return "flaky"
    return r.outcome


def write_junit(results: Iterable[Result], path: Path, *, suite_name: str = "distci", root: Path | None = None,
                verdicts: dict[str, str] | None = None) -> Path:
    """Writes JUnit XML; every testcase carries file and line, its cell id and stack summary
    as properties. `root` is where test files are looked up for their line (default: cwd).

    Known issues are `<skipped type="pytest.xfail">` with the id as the `known_issue`
    property; a pass on a rerun carries one `<flakyFailure>` per failed try, a failure
    on every try one `<rerunFailure>` per rerun (the Maven surefire elements GitHub's
    JUnit reporters read). `verdicts` (test id -> the store's verdict) makes the file say
    what the gate says. Every character XML forbids is escaped (xml_text). The file is
    written beside its place, fsync'd and renamed over it: a full disk leaves the old
    file whole (or none), never a torn one.
    """
    results = list(results)
    root = Path.cwd() if root is None else Path(root)
    kinds = [_junit_kind(r, verdicts.get(r.test_id) if verdicts else None) for r in results]
    suites = ET.Element("testsuites")
    suite = _element(
        suites,
        "testsuite",
        name=suite_name,
        tests=str(len(results)),
        failures=str(kinds.count("failed")),
        errors=str(kinds.count("error")),
        skipped=str(kinds.count("skipped") + kinds.count("xfail")),
        time=f"{sum(r.duration_s for r in results):.3f}",
    )
    if results:
        props = _element(suite, "properties")
        for key, value in sorted(results[0].stack.to_dict().items()):
            if isinstance(value, (str, int, float, bool)):
                _element(props, "property", name=f"stack.{key}", value=str(value))
    located: dict[tuple[str, str], tuple[str, int]] = {}  # a test file read once a call, not once a result
    for r, kind in zip(results, kinds):
        classname, _, name = r.test_id.rpartition("::")
        key = (r.test_id.partition("::")[0], name.split("[", 1)[0])
        if key not in located:
            located[key] = test_location(r.test_id, root)
        file, line = located[key]
        case = _element(
            suite,
            "testcase",
            classname=classname.replace("/", ".").removesuffix(".py") or "distci",
            name=name or r.test_id,
            file=file,
            line=str(line),
            time=f"{r.duration_s:.3f}",
        )
        cprops = _element(case, "properties")
        _element(cprops, "property", name="cell_id", value=r.cell_id)
        _element(cprops, "property", name="run_id", value=r.run_id)
        for key, value in stack_summary(r.stack).items():
            _element(cprops, "property", name=f"stack.{key}", value=value)
        if r.failure_kind:
            _element(cprops, "property", name="failure_kind", value=r.failure_kind)
        if r.known_issue:
            _element(cprops, "property", name="known_issue", value=r.known_issue)
        if r.repro:
            _element(cprops, "property", name="repro", value=r.repro)
        body = "\n".join(f"--- rank {x.rank} ({x.outcome}) ---\n{x.excerpt}" for x in r.ranks)
        summary = headline(r.message)[:200] or r.error_signature  # the real words, numbers included
        if kind == "xfail":
            _element(case, "skipped", r.message + ("\n" + body if body else ""), type="pytest.xfail",
                     message=f"known issue {r.known_issue}: {summary}")
        elif kind == "flaky":
            for outcome, message in r.attempts:
                if outcome in ("failed", "error"):
                    _element(case, "flakyFailure", message, message=message[:200], type=r.failure_kind or "")
        elif kind in ("failed", "error"):
            _element(case, "failure" if kind == "failed" else "error", r.message + ("\n" + body if body else ""),
                     message=summary, type=r.failure_kind or "")
            for outcome, message in r.attempts[1:]:
                _element(case, "rerunFailure", message, message=message[:200], type=r.failure_kind or "")
        elif kind == "skipped":
            _element(case, "skipped", message=r.message[:500])
    path = Path(path)
    data = ET.tostring(suites, encoding="utf-8", xml_declaration=True)
    write_atomic(path, data)
    return path


def write_atomic(path: Path, data: bytes) -> None:
    """`data` at `path`, or an OSError with `path` as it was: written to a temporary file
    beside it, fsync'd, then renamed over it."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


@dataclass(frozen=True)
class LineProblem:
    """A line of results.jsonl that is not a Result: skipped, counted, reported."""

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


def numbered_lines(path: Path, lines: Iterable[bytes], problems: list[LineProblem] | None) -> Iterator[tuple[int, Result]]:
    """(line number, Result) of each good line of results.jsonl's `lines` (a file, or its bytes
    read once), named `path` in problems: a line that does not decode, is not JSON, or is
    not a Result is appended to `problems` (when given) and skipped."""
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


def has_answer(result: Result) -> bool:
    """Whether a Result answers its test: anything but an infra failure or an error
    (the harness's words for "the test did not get to say"), or a timeout the runner's load
    caused (saturated, the ranks still computing) that was not run again with a longer
    budget. A resumed run reruns the tests without one; a report keeps a test's latest
    answer over a later non-answer."""
    if result.failure_kind == "infra" or result.outcome == "error":
        return False
    load = getattr(result, "load", None) or {}
    slowed = result.failure_kind in ("timeout", "hang") and load.get("saturated") and load.get("progressing")
    return not (slowed and "retried_with_s" not in load)
