"""Turns what every rank did in one test into one outcome and failure kind.

The rules, in order:
- a rank process died (exit code, signal)              -> failed / crash
- a rank raised an error that says a collective timed out -> failed / hang
- a rank raised                                         -> failed / assert | exception
- ranks still running at the deadline:
    some rank already returned, or a stuck rank's main
    thread has a torch.distributed frame (waiting for
    a peer in a collective)                             -> failed / hang
    otherwise (plain slow compute)                      -> failed / timeout
- every rank skipped (or some skipped, none failed)     -> skipped
- every rank passed                                     -> passed
Nothing a passing test leaves in its processes needs judging: each test runs in fresh
forks of the rank workers (template.py), so it cannot reach the next test.

Only the FILE of each stack frame counts as evidence of a collective: a test named
`test_broadcast_*` spinning in pure Python is slow, not hung.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field

from typing import Any

from distci.results import RankExcerpt, Result, error_signature
from distci.stack import Stack
from distci.harness.protocol import CHANNEL_BROKEN_EXIT, RankReport

# Where a frame's file is named: faulthandler `File "PATH", line N in FN`, py-spy `FN (PATH:N)`.
FRAME_FILES = re.compile(r'File "([^"]+)", line \d+|\(([^()\s]+\.py):\d+\)')
COLLECTIVE_FILE = re.compile(r"(?:^|/)torch/distributed/|(?:^|/)torch_npu/distributed/")
COLLECTIVE_TIMEOUT = re.compile(
    r"timed out|timeout|Timed out|Watchdog caught collective operation timeout|"
    r"wait timeout|DistBackendError.*(?:timeout|Timed)", re.IGNORECASE
)
DISK_FULL = re.compile(r"\[Errno (?:27|28|122)\]|No space left on device|File too large|Disk quota exceeded")
"""A failure that says the disk (or a file-size or quota limit) is full: `infra`."""
MESSAGE_CHARS = 20000
RERUN_MESSAGE_CHARS = 4000
PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET", re.IGNORECASE)
LAST_WORDS = "distci: this rank ends itself: "
"""A rank that ends itself on purpose (a test's own watchdog that diagnosed the case, e.g. the
ops pulses' deadlock) writes this marker and its diagnosis (JSON, one line) to stderr first:
its crash Result then carries the diagnosis, so the known-issue registry can match it, instead
of a bare "exited with code 1"."""


def say_last_words(message: str) -> None:
    """Rank side: write this rank's diagnosis before it ends itself (see LAST_WORDS)."""
    import json
    import sys

    print(LAST_WORDS + json.dumps(message), file=sys.stderr, flush=True)


def last_words(log: str) -> str | None:
    """The diagnosis a rank wrote before ending itself (the last one in its log), or None."""
    import json

    at = log.rfind(LAST_WORDS)
    if at < 0:
        return None
    line = log[at + len(LAST_WORDS):].split("\n", 1)[0]
    try:
        words = json.loads(line)
    except ValueError:
        return None
    return words if isinstance(words, str) else None


@dataclass
class RankState:
    """What the controller knows about one rank at the end of a test."""

    rank: int
    report: RankReport | None = None
    exit_code: int | None = None  # set when the process died during the test
    channel: str = ""  # set when its control channel broke: how (the process may still run)
    stuck: bool = False  # still running when the controller stopped waiting
    stack: str = ""  # stack dump taken when stuck
    pid: int | None = None  # the process that ran the test (a fork of the rank's worker)
    oom: str = ""  # set when a SIGKILL was the OOM killer's: the evidence (machine.oom_evidence)
    log: str = ""  # the rank's log lines written during the test


@dataclass
class Combined:
    outcome: str
    failure_kind: str | None = None
    exc_type: str = ""
    message: str = ""
    signature: str | None = None
    ranks: list[RankExcerpt] = field(default_factory=list)
    duration_s: float = 0.0
    needs_rebuild: bool = False
    attempts: list[tuple[str, str]] = field(default_factory=list)  # earlier runs: (outcome, message)
    load: dict[str, Any] | None = None  # set on a timeout or hang: the runner's load, the ranks' progress

    @property
    def slowed_by_load(self) -> bool:
        """A timeout (or a hang whose peer was still computing) on a saturated runner while
        the ranks were making progress: the machine was slow, not (yet) the test."""
        return bool(self.load and self.load.get("saturated") and self.load.get("progressing"))

    def _failure(self) -> tuple[str, str | None, str | None]:
        """(message, failure kind, signature) as a Result carries them."""
        failing = self.outcome in ("failed", "error")
        message = f"{self.exc_type}: {self.message}" if failing and self.exc_type else self.message
        kind = self.failure_kind if failing else None
        if failing and DISK_FULL.search(message):
            kind = "infra"  # the machine ran out of room, not the code under test
        return message, kind, self.signature if failing else None

    def known_issue(self, registry: Any, test_id: str, stack: Stack) -> str | None:
        """The known issue this outcome stands for, from the one matcher (None without a registry)."""
        if registry is None:
            return None
        message, kind, signature = self._failure()
        return registry.known_issue_of(test_id, self.outcome, signature=signature, message=message, stack=stack,
                                       failure_kind=kind)

    def to_result(self, *, run_id: str, cell_id: str, test_id: str, stack: Stack, repro: str,
                  started_at: str = "", log_path: str = "", registry: Any = None) -> Result:
        """THE Combined -> Result builder (the harness's recorder and the external runner
        both record through it): the failure text, its kind and signature only for a
        failure, earlier attempts as reruns, and the known issue from the one matcher."""
        message, kind, signature = self._failure()
        known = self.known_issue(registry, test_id, stack)
        return Result(
            run_id=run_id, cell_id=cell_id, test_id=test_id, outcome=self.outcome, stack=stack, failure_kind=kind,
            error_signature=signature, message=message[:MESSAGE_CHARS], duration_s=round(self.duration_s, 3),
            reruns=len(self.attempts), rerun_outcomes=[o for o, _ in self.attempts],
            rerun_messages=[text[:RERUN_MESSAGE_CHARS] for _, text in self.attempts], ranks=list(self.ranks),
            repro=repro, known_issue=known, started_at=started_at, log_path=log_path, load=self.load,
        )

    def render(self) -> str:
        """The failure text pytest shows: the outcome line, then each rank's excerpt."""
        head = f"[{self.failure_kind}] {self.exc_type}: {self.message}".strip()
        parts = [head]
        for r in self.ranks:
            parts.append(f"----- rank {r.rank}: {r.outcome} -----\n{r.excerpt}".rstrip())
        return "\n".join(parts)


def _main_thread(stack: str) -> str:
    """The main thread's part of a faulthandler / py-spy dump (helper threads would mislead)."""
    for marker in ("Current thread 0x", "(idle)", "Thread "):
        at = stack.find(marker)
        if marker.startswith("Current") and at >= 0:
            return stack[at:]
    return stack


def in_collective(stack: str) -> bool:
    """Does the main thread of this stack dump stand in torch.distributed code?"""
    for match in FRAME_FILES.finditer(_main_thread(stack)):
        path = (match.group(1) or match.group(2) or "").replace("\\", "/")
        if COLLECTIVE_FILE.search(path):
            return True
    return False


COLLECTIVE_WAIT_FILE = re.compile(r"(?:^|/)torch/distributed/(?:distributed_c10d|_functional_collectives|c10d_logger)\.py$")


def waiting_in_collective(stack: str) -> bool:
    """Is the main thread's innermost Python frame a collective call (where a rank blocks on its
    peers)? Narrower than in_collective: DTensor's sharding propagation and cost models live
    under torch/distributed/ too, and a rank computing there is busy, not waiting."""
    for match in FRAME_FILES.finditer(_main_thread(stack)):  # most recent call first
        path = (match.group(1) or match.group(2) or "").replace("\\", "/")
        return bool(COLLECTIVE_WAIT_FILE.search(path))
    return False


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code == CHANNEL_BROKEN_EXIT:
        return f"exited with code {code}: its control channel to the controller broke"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _tail(text: str, limit: int = 6000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _excerpt(state: RankState) -> RankExcerpt:
    who = f"rank {state.rank}"
    if state.exit_code is not None or state.channel:
        outcome = "crash"
        body = f"{who} {'' if state.channel else 'process '}{_death(state)}\n{_tail(state.log)}"
    elif state.stuck:
        outcome = "stuck"
        body = (f"{who} still running at the deadline; its stack:\n{_tail(state.stack or '(no stack captured)', 8000)}"
                f"\n--- {who} log ---\n{_tail(state.log, 2000)}")
    elif state.report is None:
        outcome, body = "unknown", f"{who} sent no report\n{_tail(state.log)}"
    else:
        outcome = state.report.outcome
        body = state.report.traceback or state.report.message
        if state.report.outcome != "passed":
            body = f"{who} {outcome}:\n{_tail(body)}\n--- {who} log ---\n{_tail(state.log, 2000)}"
        else:
            body = ""
    return RankExcerpt(rank=state.rank, outcome=outcome, excerpt=body.strip())


def _death(state: RankState) -> str:
    """How a rank was lost: its exit (the OOM killer's, when the evidence says so), or its
    control channel breaking (no signal involved)."""
    if state.oom:
        return f"was killed by the kernel's OOM killer (SIGKILL; {state.oom})"
    if state.channel and state.exit_code in (None, CHANNEL_BROKEN_EXIT):
        still = "while its process was still running" if state.exit_code is None else "and the rank exited"
        return f"lost its control channel to the controller ({state.channel}) {still}"
    return describe_exit(state.exit_code)


FAULT_SIGNALS = frozenset(int(getattr(signal, n)) for n in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGSYS")
                          if hasattr(signal, n))
"""Signals a process gets from its own fault (a bad access, an abort), never from whoever stops it."""


def _faulted(state: RankState) -> bool:
    """Whether the rank died of its own fault. When several ranks died, that one is the cause:
    a peer then leaves on its own (a finished rank waiting for the others exits once one is
    gone), and in rank order it would be named first (rank 0 "exited with code 70" for rank
    1's SIGSEGV, seen in CI once in a few runs)."""
    return state.exit_code is not None and -state.exit_code in FAULT_SIGNALS


def combine(states: list[RankState], duration_s: float) -> Combined:
    ranks = [_excerpt(s) for s in states]
    dead = [s for s in states if s.exit_code is not None or s.channel]
    stuck = [s for s in states if s.stuck]
    failed = [s for s in states if s.report is not None and s.report.outcome == "failed"]
    returned = [s for s in states if s.report is not None]
    needs_rebuild = bool(dead or stuck)

    def done(outcome: str, kind: str | None, exc_type: str, message: str) -> Combined:
        sig = error_signature(exc_type, message) if outcome == "failed" else None
        return Combined(outcome, kind, exc_type, message, sig, ranks, duration_s, needs_rebuild)

    if dead:
        first = next((s for s in dead if s.oom), None) or next((s for s in dead if _faulted(s)), dead[0])
        words = None if first.oom else next(((s, w) for s in dead if (w := last_words(s.log))), None)
        died = f" (ranks {', '.join(str(s.rank) for s in dead)} died)" if len(dead) > 1 else ""
        if words:  # its diagnosis, first line first: the headline the registry matches
            first, said = words
            msg = f"rank {first.rank} ended itself{died}: {said}"
        else:
            msg = f"rank {first.rank} {_death(first)}{died}"
        return done("failed", "crash", "RankOOM" if first.oom else "RankCrash", msg)
    for s in failed:
        rep = s.report
        assert rep is not None
        if COLLECTIVE_TIMEOUT.search(rep.message) and "distributed" in (rep.traceback + rep.exc_type).lower():
            return done("failed", "hang", rep.exc_type, f"rank {s.rank}: {rep.message}")
    real = [s for s in failed if not PEER_GONE.search(s.report.message)]  # type: ignore[union-attr]
    if real or failed:
        s = (real or failed)[0]
        rep = s.report
        assert rep is not None
        return done("failed", rep.kind or "exception", rep.exc_type, rep.message)
    if stuck:
        collective = any(in_collective(s.stack) for s in stuck)
        which = ", ".join(str(s.rank) for s in stuck)
        if returned or collective:
            return done("failed", "hang", "RankHang", f"rank(s) {which} stuck in a collective past the test timeout")
        return done("failed", "timeout", "TestTimeout", f"rank(s) {which} still running at the test timeout")
    skipped = [s for s in states if s.report is not None and s.report.outcome == "skipped"]
    if skipped:
        return Combined("skipped", None, "", skipped[0].report.message, None, ranks, duration_s, False)  # type: ignore[union-attr]
    return Combined("passed", None, "", "", None, ranks, duration_s, False)
