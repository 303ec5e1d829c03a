"""Reading what an upstream test did: exit codes and logs, JUnit files, loss logs.

Upstream tests do not write distci's records, so their outcome is read back from what
they leave: torchrun's failure summary (which rank died, by which signal), each rank's
traceback in the log (the root cause, not the launcher's wrapper error), a JUnit file,
or the losses a training run logged, compared with the expected losses upstream ships.
Everything ends in the harness's RankState/combine, so the failure kinds and error
signatures are the same as for native tests.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from distci.harness.outcome import Combined, RankState, combine
from distci.harness.protocol import RankReport
from distci.results import RankExcerpt, error_signature

RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d+)\]:? ?")
_FAILURE_BLOCK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure|Warning)\w*|[A-Za-z_][\w.]*\.\w*Error)(?::\s?(.*))?$")
_JUNIT_WHERE = re.compile(r":\d+: ([A-Za-z_][\w.]*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_LOSS = re.compile(r"step:\s*(\d+)\s*loss:\s*(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)", re.IGNORECASE)
# Wrapper errors a launcher raises because a rank failed: never the root cause.
_WRAPPERS = ("ChildFailedError", "CalledProcessError")
_SIGTERM = -15


def split_ranks(text: str) -> dict[int, str]:
    """Each rank's lines of a torchrun log (``[rankN]:`` / ``[defaultN]:`` prefixes removed)."""
    found: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = RANK_PREFIX.match(line)
        if m:
            found.setdefault(int(m.group(1)), []).append(line[m.end():])
    return {rank: "\n".join(lines) for rank, lines in found.items()}


def torchrun_exit_codes(text: str) -> tuple[dict[int, int], set[int]]:
    """Exit codes from torchrun's failure summary, and the root-cause ranks."""
    codes = {int(r): int(c) for r, c in _FAILURE_BLOCK.findall(text)}
    root: set[int] = set()
    at = text.rfind("Root Cause")
    if at >= 0:
        root = {int(r) for r, _ in _FAILURE_BLOCK.findall(text[at:])}
    return codes, root


@dataclass
class FoundException:
    exc_type: str
    message: str
    traceback: str


def exceptions(text: str, wrappers: tuple[str, ...] = ()) -> list[FoundException]:
    """Every exception a Python traceback in `text` ended with, in order, wrappers left out:
    launcher errors, and errors whose message starts with one of `wrappers` (a runner's
    "this test failed" that only repeats a rank's failure)."""
    lines = [_ANSI.sub("", ln) for ln in text.splitlines()]
    found: list[FoundException] = []
    i = 0
    while i < len(lines):
        if lines[i].strip().startswith("Traceback (most recent call last)"):
            start = i
            i += 1
            while i < len(lines) and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
                i += 1
            if i < len(lines):
                m = _EXC_LINE.match(lines[i].strip())
                if m:
                    exc_type = m.group(1).rsplit(".", 1)[-1] if m.group(1).startswith("builtins.") else m.group(1)
                    message = (m.group(2) or "").strip()
                    j = i + 1  # a multi-line message continues until a blank line or a new block
                    while not message and j < len(lines) and lines[j].strip() and not lines[j].startswith(" "):
                        message = lines[j].strip()
                        j += 1
                    if not any(exc_type.endswith(w) for w in _WRAPPERS) and not message.startswith(wrappers):
                        found.append(FoundException(exc_type, message, "\n".join(lines[start:i + 1])))
            continue
        i += 1
    return found


def _report(rank: int, exc: FoundException) -> RankReport:
    kind = "assert" if exc.exc_type.rsplit(".", 1)[-1] == "AssertionError" else "exception"
    return RankReport(rank, "failed", kind=kind, exc_type=exc.exc_type, message=exc.message, traceback=exc.traceback)


def fill_rank_states(states: list[RankState], text: str, *, returncode: int | None) -> None:
    """Complete what per-rank reports left open: each rank's log lines, and why a rank
    with no report is gone (its signal or exit code from torchrun's summary).

    A rank torchrun stopped (SIGTERM) because another rank had already failed is not a
    second crash; it stays without an outcome, so the root cause names the failure.
    """
    per_rank = split_ranks(text)
    codes, root = torchrun_exit_codes(text)
    for st in states:
        st.log = per_rank.get(st.rank, "")
    open_states = [s for s in states if s.report is None and not s.stuck]
    if not open_states or returncode is None:
        return
    for st in open_states:
        code = codes.get(st.rank)
        if code is None or (code == _SIGTERM and root and st.rank not in root):
            continue
        st.exit_code = code
    if not any(s.exit_code is not None for s in states) and not any(
            s.report is not None and s.report.outcome == "failed" for s in states):
        for st in open_states:  # no summary to go by: a rank that never reported is gone
            st.exit_code = returncode or 1


def faulthandler_dump(text: str, rank: int | None = None) -> str:
    """The Python stack faulthandler printed for a rank (on SIGABRT / SIGUSR1), if any."""
    body = split_ranks(text).get(rank, "") if rank is not None else ""
    body = body or text
    for marker in ("Fatal Python error", "Current thread 0x", "Thread 0x"):
        at = body.rfind(marker)
        if at >= 0:
            return body[at:][-8000:]
    return ""


def command_outcome(returncode: int | None, timed_out: bool, text: str, duration_s: float,
                    stuck: list[RankState], *, wrappers: tuple[str, ...] = ()) -> Combined:
    """The outcome of an upstream runner command from its exit and its log."""
    if timed_out:
        states = stuck or [RankState(0, stuck=True, stack=faulthandler_dump(text), log=text[-4000:])]
        return combine(states, duration_s)
    if returncode == 0:
        return Combined("passed", duration_s=duration_s)
    per_rank = split_ranks(text)
    codes, root = torchrun_exit_codes(text)
    states: list[RankState] = []
    for rank in sorted(set(per_rank) | set(codes)):
        st = RankState(rank, log=per_rank.get(rank, ""))
        found = exceptions(per_rank.get(rank, ""), wrappers)
        code = codes.get(rank)
        if code is not None and code < 0 and not (code == _SIGTERM and root and rank not in root):
            st.exit_code = code
        elif found:
            st.report = _report(rank, found[0])
        states.append(st)
    if any(s.exit_code is not None or s.report is not None for s in states):
        return combine(states, duration_s)
    found = exceptions(text, wrappers)
    if found:
        return combine([RankState(0, report=_report(0, found[0]), log=text[-6000:])], duration_s)
    return combine([RankState(0, exit_code=returncode if returncode is not None else 1, log=text[-6000:])],
                   duration_s)


def skipped(message: str, duration_s: float = 0.0) -> Combined:
    return Combined("skipped", message=message, duration_s=duration_s)


def failed(kind: str, exc_type: str, message: str, duration_s: float = 0.0, ranks=None) -> Combined:
    return Combined("failed", kind, exc_type, message, error_signature(exc_type, message), list(ranks or []),
                    duration_s)


# --------------------------------------------------------------------------- JUnit


@dataclass
class JUnitCase:
    classname: str
    name: str
    outcome: str
    kind: str | None
    exc_type: str
    message: str
    text: str
    time_s: float


def read_junit(path: Path) -> list[JUnitCase]:
    """Every testcase of a JUnit XML file (pytest's, or any producer's)."""
    root = ET.parse(path).getroot()
    cases = []
    for tc in root.iter("testcase"):
        outcome, kind, exc_type, message, text = "passed", None, "", "", ""
        for tag in ("failure", "error", "skipped"):
            el = tc.find(tag)
            if el is None:
                continue
            message = el.get("message", "") or ""
            text = el.text or ""
            if tag == "skipped":
                outcome = "skipped"
                message = message.removeprefix("Skipped: ")
                break
            outcome = "failed" if tag == "failure" else "error"
            head = message.strip().splitlines()[0] if message.strip() else ""
            m = _EXC_LINE.match(head)
            if m:
                exc_type, message = m.group(1), (m.group(2) or "").strip()
            else:  # pytest's plain `assert` message: the type is on the report's last line
                where = _JUNIT_WHERE.search(text.strip().splitlines()[-1]) if text.strip() else None
                exc_type = where.group(1) if where else (el.get("type") or tag.capitalize())
                message = head
            kind = "assert" if exc_type.rsplit(".", 1)[-1] == "AssertionError" else "exception"
            break
        cases.append(JUnitCase(tc.get("classname", ""), tc.get("name", ""), outcome, kind, exc_type, message,
                               text, float(tc.get("time", 0) or 0)))
    return cases


def junit_outcome(case: JUnitCase) -> Combined:
    if case.outcome == "passed":
        return Combined("passed", duration_s=case.time_s)
    if case.outcome == "skipped":
        return skipped(case.message, case.time_s)
    report = [RankExcerpt(0, case.outcome, case.text.strip()[-6000:])] if case.text.strip() else []
    combined = failed(case.kind or "exception", case.exc_type, case.message, case.time_s, report)
    combined.outcome = case.outcome
    return combined


# --------------------------------------------------------------------------- losses


def read_losses(text: str) -> dict[int, float]:
    """`step: N  loss: X` lines of a training log (torchtitan's format), last value per step."""
    losses: dict[int, float] = {}
    for line in text.splitlines():
        m = _LOSS.search(_ANSI.sub("", line))
        if m:
            losses[int(m.group(1))] = float(m.group(2))
    return losses


def read_loss_file(path: Path) -> dict[int, float]:
    """An expected-losses file as upstream ships them: one `step loss` pair per line."""
    losses = {}
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].isdigit():
            losses[int(parts[0])] = float(parts[1])
    return losses


def check_losses(actual: dict[int, float], expected: dict[int, float] | None, *, rtol: float = 0.0,
                 min_steps: int = 1) -> tuple[str, str] | None:
    """None when the losses are right; else (exception type, message) of the first problem.

    A run that logged no loss did not train ("it ran" is not a pass); a NaN/inf loss is a
    failure; with `expected`, every expected step must be logged and match within `rtol`
    (0: equal as printed, which is what upstream's own loss check asserts).
    """
    if len(actual) < min_steps:
        return "LossMissing", f"the run logged {len(actual)} loss values, expected at least {min_steps}"
    bad = [s for s, v in sorted(actual.items()) if not math.isfinite(v)]
    if bad:
        return "LossNotFinite", f"loss at step {bad[0]} is {actual[bad[0]]}"
    if expected is None:
        return None
    missing = [s for s in sorted(expected) if s not in actual]
    if missing:
        return "LossMissing", f"no loss logged for step {missing[0]} (expected {len(expected)} steps)"
    for step in sorted(expected):
        want, got = expected[step], actual[step]
        if (got != want) if rtol == 0 else abs(got - want) > rtol * abs(want):
            return "LossMismatch", f"loss at step {step} is {got}, upstream expects {want} (rtol {rtol})"
    return None
