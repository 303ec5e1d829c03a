"""Outcome records: one Result per test per run, written as JSONL and JUnit.

The JSONL file of a run is the source of truth: it is appended to while the run goes
(one line per finished test, flushed and fsync'd, so a crash loses nothing already
finished) and never rewritten afterwards. The SQLite store and the dashboard are
indexes over these files. JUnit is written alongside for CI systems that read it.

This module runs inside cell environments too (the harness writes results), so it uses
the standard library only.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Iterator

SCHEMA_VERSION = 1

OUTCOMES = ("passed", "failed", "error", "skipped")
FAILURE_KINDS = ("assert", "exception", "timeout", "hang", "crash", "infra")

RESULTS_FILE = "results.jsonl"
JUNIT_FILE = "junit.xml"
STACK_FILE = "stack.json"


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
    issues) is computed later by distci.verdicts and is not part of this record, except
    `known_issue`, the id of the registry entry the harness matched, if any.
    """

    run_id: str
    cell_id: str
    test_id: str
    outcome: str
    stack: dict[str, Any]
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
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {OUTCOMES}")
        if self.failure_kind is not None and self.failure_kind not in FAILURE_KINDS:
            raise ValueError(f"failure_kind {self.failure_kind!r} is not one of {FAILURE_KINDS}")
        if not self.cell_id:
            raise ValueError("a Result needs its cell id")
        self.ranks = [r if isinstance(r, RankExcerpt) else RankExcerpt(**r) for r in self.ranks]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Result":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


_SIGNATURE_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"0x[0-9a-fA-F]+"), "0x?"),
    (re.compile(r"(?:/[\w.+-]+)+/([\w.+-]+\.py)"), r"\1"),
    (re.compile(r"\[rank\d+\]:?"), ""),
    (re.compile(r"\brank \d+\b"), "rank N"),
    (re.compile(r"line \d+"), "line N"),
    (re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])"), "N"),
    (re.compile(r"\s+"), " "),
)


def error_signature(exc_type: str, message: str) -> str:
    """A stable one-line key for a failure, so one bug groups across cells and nights.

    Addresses, numbers (shapes, timings, ranks), line numbers and directory prefixes
    change between runs of the same bug; they are normalized away. Only the first line
    of the message counts.
    """
    first = next((line for line in message.strip().splitlines() if line.strip()), "")
    text = first.strip()
    for pattern, repl in _SIGNATURE_RULES:
        text = pattern.sub(repl, text)
    return f"{exc_type}: {text.strip()}"[:300]


class ResultWriter:
    """Appends Results to a run's results.jsonl, one durable line per test."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / RESULTS_FILE

    def write(self, result: Result) -> None:
        line = json.dumps(result.to_dict(), sort_keys=True, default=str)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def read_results(path: Path) -> Iterator[Result]:
    """Yields the Results of a results.jsonl file (or a run directory holding one).

    A torn last line (the writer died mid-write) is skipped, not fatal: every complete
    line before it is still good.
    """
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            yield Result.from_dict(data)


def stack_summary(stack: dict[str, Any]) -> dict[str, str]:
    """The few stack fields worth a JUnit property on every testcase."""
    keys = ("torch", "torch_git", "torchao", "torchtitan", "torch_npu", "python", "device_name", "image_digest")
    return {k: str(stack[k]) for k in keys if stack.get(k)}


def write_junit(results: Iterable[Result], path: Path, *, suite_name: str = "distci") -> Path:
    """Writes JUnit XML; every testcase carries its cell id and stack summary as properties."""
    results = list(results)
    failures = sum(r.outcome == "failed" for r in results)
    errors = sum(r.outcome == "error" for r in results)
    skipped = sum(r.outcome == "skipped" for r in results)
    total_time = sum(r.duration_s for r in results)
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=suite_name,
        tests=str(len(results)),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
        time=f"{total_time:.3f}",
    )
    if results:
        props = ET.SubElement(suite, "properties")
        for key, value in sorted(results[0].stack.items()):
            if isinstance(value, (str, int, float, bool)):
                ET.SubElement(props, "property", name=f"stack.{key}", value=str(value))
    for r in results:
        classname, _, name = r.test_id.rpartition("::")
        case = ET.SubElement(
            suite,
            "testcase",
            classname=classname.replace("/", ".").removesuffix(".py") or "distci",
            name=name or r.test_id,
            time=f"{r.duration_s:.3f}",
        )
        cprops = ET.SubElement(case, "properties")
        ET.SubElement(cprops, "property", name="cell_id", value=r.cell_id)
        ET.SubElement(cprops, "property", name="run_id", value=r.run_id)
        for key, value in stack_summary(r.stack).items():
            ET.SubElement(cprops, "property", name=f"stack.{key}", value=value)
        if r.failure_kind:
            ET.SubElement(cprops, "property", name="failure_kind", value=r.failure_kind)
        if r.repro:
            ET.SubElement(cprops, "property", name="repro", value=r.repro)
        body = "\n".join(f"--- rank {x.rank} ({x.outcome}) ---\n{x.excerpt}" for x in r.ranks)
        if r.outcome == "failed":
            el = ET.SubElement(case, "failure", message=r.error_signature or r.message[:200], type=r.failure_kind or "")
            el.text = r.message + ("\n" + body if body else "")
        elif r.outcome == "error":
            el = ET.SubElement(case, "error", message=r.error_signature or r.message[:200], type=r.failure_kind or "")
            el.text = r.message + ("\n" + body if body else "")
        elif r.outcome == "skipped":
            ET.SubElement(case, "skipped", message=r.message[:500])
    path = Path(path)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
    return path
