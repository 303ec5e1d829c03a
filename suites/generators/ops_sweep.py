"""A sweep's bookkeeping on disk, so a case that kills its sweep costs that case, not the rest.

A sweep (suites/generators/ops_entry.py::test_op_sweep) runs its world size's cases in order
on one set of forked ranks. A case can end those ranks: an error raised on some ranks only
leaves the others in a collective that never completes (in a real job, a hang), a crash
kills a rank, a case can deadlock every rank. The pytest session then runs the sweep's next
*resume slot* (`test_op_sweep[ws4-resume1]`, ...) on fresh forks of the warm pool: it reads
what the dead slot left here, records the case it died on, and goes on after it. Before,
the cases after a dead one went back to the controller for a new pytest session (new pools:
tens of seconds on 2 cores) and every death cost a session.

Two bounds turn a dead case into a record instead of a wait for the test's timeout:
- the outcome is agreed on a side group with a short timeout (`hang_s`): a rank that finished
  the case and waits longer than that for the others writes its own outcome here
  (`ws{n}.stuck-r{rank}.json`) and ends the slot; the harness stops the ranks still inside
  the case's collectives after its failure grace;
- a per-case watchdog (faulthandler's timer, `case_limit_s`) ends a rank, its stack in the
  rank log, when no rank ever finishes (every rank deadlocked).

Files, per world size, in the sweep's folder (all on the host the ranks share):
  ws{n}.jsonl            one row per case answered (rank 0 appends; the controller reads it)
  ws{n}.current.json     the case in flight (and the shrink candidate, with the shrink so far)
  ws{n}.stuck-r{k}.json  rank k's outcome of a case the other ranks never finished
  ws{n}.done             the world size's cases are all answered: no resume slot runs
  ws{n}.pulse-r{k}.json  rank k's count of collectives issued per group, and since when
                         unchanged, and since when its main thread last used CPU (a Pulse:
                         how a peer tells a rank blocked in a collective from one still
                         working, without asking it)
  ws{n}.deadlock.json    every rank's last pulse when all of them had stood still (no new
                         collective, no CPU) for QUIET_S inside a case: no rank can finish it
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

RESUME_SLOTS = 6
"""Resume slots per world size and sweep: deaths beyond them go back to the controller."""
HANG_S = 30.0
"""How long a rank that finished a case waits for the others before it calls them stuck (a
case costs milliseconds, under load a few seconds: 30 s is a hang, not a slow rank)."""
CASE_LIMIT_S = 300.0
"""The watchdog: no case (one shrink candidate) may keep a rank longer. A case that spins in
Python is cut well before by its own time bound (suites/generators/case_bound.py, 10-40 s);
this is for ranks that all block in C (a deadlock every rank shares), which no Python-level
bound interrupts."""
SLOT_S = 480.0
"""A slot takes no new case after this long: the next slot goes on, so a sweep slowed by load
never reaches the test's timeout (900 s) in the middle of a healthy case."""

WENT_ON = "went_on"
"""The status of a rank that finished a phase some peer raised in, or never reached the agreement
after (suites/generators/ops_outcome.py): its outcome is theirs, never an error of its own."""


PULSE_S = 0.5
"""How often a rank's Pulse writes its counts."""
STALL_S = 3.0
"""A peer whose counts stood still this long while ahead of this rank's is blocked (a case's
collective is milliseconds; a peer computing issues none, so it is never ahead)."""
QUIET_S = 10.0
"""Every rank standing still this long (no collective issued, its main thread using no CPU)
inside a case: none can move the others, so the case can never finish. A rank computing, however
slowly (sdpa's propagation at load 30 on 2 cores still gets ~60 ms of CPU a second), or
spinning, is never quiet; a rank waiting in a collective or at an agreement uses none."""
BUSY_CPU = 0.01
"""CPU seconds per second above which a rank's main thread is working, not waiting (a rank
polling the raised-anywhere agreement uses ~1 ms a second; one computing at load 30, ~60 ms)."""
DEADLOCK_GRACE_S = 5.0
"""A rank waiting at the raised-anywhere agreement leaves after QUIET_S (its outcome filed as
the case's); the ranks' own threads end a slot none of whose ranks is there this much later."""


@dataclass(frozen=True)
class SweepFiles:
    """One world size's files in one sweep's folder."""

    folder: Path
    world: int

    @property
    def rows(self) -> Path:
        return self.folder / f"ws{self.world}.jsonl"

    @property
    def current(self) -> Path:
        return self.folder / f"ws{self.world}.current.json"

    @property
    def done(self) -> Path:
        return self.folder / f"ws{self.world}.done"

    def stuck_file(self, rank: int) -> Path:
        return self.folder / f"ws{self.world}.stuck-r{rank}.json"

    def answered(self) -> set[str]:
        out = set()
        if self.rows.exists():
            for line in self.rows.read_text().splitlines():
                try:
                    out.add(json.loads(line)["id"])
                except (ValueError, KeyError):  # a line cut by a dying rank
                    continue
        return out

    def in_flight(self) -> dict[str, Any] | None:
        """What the last slot was running when it ended (None: it ended between cases)."""
        try:
            return json.loads(self.current.read_text())
        except (OSError, ValueError):
            return None

    def begin(self, case_id: str, candidate: str | None = None, record: dict | None = None,
              best: dict | None = None, probe: dict | None = None) -> None:
        """Rank 0, before a case (or a shrink candidate of `case_id`) runs; `probe`: the case
        ran (this is its row) and the ranks' groups are being checked for step after it."""
        _write(self.current, {"id": case_id, "candidate": candidate, "record": record, "best": best,
                              "probe": probe, "started": time.time()})

    def end(self) -> None:
        self.current.unlink(missing_ok=True)

    def stuck(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.folder.glob(f"ws{self.world}.stuck-r*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def write_stuck(self, rank: int, case_id: str, outcome: dict[str, Any]) -> None:
        """This rank's outcome (CaseOutcome's fields) of a case the others never finished."""
        _write(self.stuck_file(rank), {"rank": rank, "id": case_id, **outcome})

    def clear_stuck(self) -> None:
        for path in self.folder.glob(f"ws{self.world}.stuck-r*.json"):
            path.unlink(missing_ok=True)

    def pulse_file(self, rank: int) -> Path:
        return self.folder / f"ws{self.world}.pulse-r{rank}.json"

    @property
    def deadlock_file(self) -> Path:
        return self.folder / f"ws{self.world}.deadlock.json"

    def deadlock(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.deadlock_file.read_text())
        except (OSError, ValueError):
            return None


class Pulse:
    """A rank's collectives issued per group (`counts`: group key -> count, the same keys on
    every member) and when its main thread last used CPU, written every PULSE_S by a thread
    while the slot runs; `blocked_peer` reads the peers'. Why: a rank waiting at the
    raised-anywhere agreement cannot tell a peer blocked in a collective (clip_grad_norm's inf
    norm with an empty shard raises on its rank, the peers wait in the op's all-reduce: they
    never arrive) from a peer still in a slow op (sdpa's CPU propagation: it arrives), so it
    waited the largest bound any rank can hold (~45 s) before ending the slot. Two signs that
    a peer never arrives: it issued more collectives on a group than this rank did and none
    for STALL_S (it waits in one this rank, done with the phase, never issues); or every rank
    stood still for QUIET_S (no collective, no CPU: nobody left to move anyone). A case whose
    ranks all wait in collectives that never pair (index_add's output placements differing by
    rank, reports/fuzz-ops.md) has no rank at the agreement: the thread itself ends its rank
    DEADLOCK_GRACE_S later (`ws{n}.deadlock.json`, then the rank's stacks and exit, as the
    watchdog does at 300 s), and the next slot files the case. The thread reads counts and
    clocks only (no collective, no lock)."""

    def __init__(self, files: SweepFiles, rank: int, world: int, counts: Callable[[], dict[str, int]],
                 exit_rank: Callable[[str], None] | None = None) -> None:
        self.files, self.rank, self.world, self.counts = files, rank, world, counts
        self.exit_rank = exit_rank or _exit_rank
        self._cpu = _main_thread_cpu()
        self.settling = False
        """The main thread waits in the case's outcome agreement (its own timeout ends that wait
        and files this rank's outcome: no deadlock is declared while a rank is there)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="distci-ops-pulse", daemon=True)

    def __enter__(self) -> "Pulse":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.files.pulse_file(self.rank).unlink(missing_ok=True)

    def _beat(self) -> None:
        last: dict[str, int] | None = None
        changed = busy = time.time()
        cpu = self._cpu()
        while not self._stop.is_set():
            try:
                now = self.counts()
            except Exception:  # a mesh cached while read: the next beat reads it
                now = last
            at = time.time()
            if now != last:
                last, changed = now, at
            used = self._cpu()
            if used is None or cpu is None or used - cpu >= BUSY_CPU * PULSE_S:
                busy = at  # where CPU cannot be read, the rank always counts as working
            cpu = used
            if last:
                _write(self.files.pulse_file(self.rank), {"counts": last, "changed": changed, "busy": busy, "at": at,
                                                             "settling": self.settling})
                self._end_if_deadlocked(at)
            self._stop.wait(PULSE_S)

    def _beats(self, now: float) -> dict[int, dict[str, Any]]:
        """Every rank's last pulse still beating (read from the files, this rank's included)."""
        out = {}
        for rank in range(self.world):
            try:
                beat = json.loads(self.files.pulse_file(rank).read_text())
            except (OSError, ValueError):
                continue
            if now - beat["at"] <= 3 * PULSE_S + 1:
                out[rank] = beat
        return out

    def _all_quiet_s(self, beats: dict[int, dict[str, Any]], now: float) -> float:
        """How long every rank has stood still (0 unless every rank beats)."""
        if len(beats) < self.world:
            return 0.0
        return min(now - max(b["changed"], b.get("busy", now)) for b in beats.values())

    def _end_if_deadlocked(self, now: float) -> None:
        beats = self._beats(now)
        if self._all_quiet_s(beats, now) < QUIET_S + DEADLOCK_GRACE_S or any(b.get("settling") for b in beats.values()):
            return
        flight = self.files.in_flight()
        if not flight or flight.get("probe"):  # between cases, or the in-step check's own bounded barrier
            return
        dead_id = flight.get("candidate") or flight["id"]
        counts = {str(r): b["counts"] for r, b in sorted(beats.items())}
        _write(self.files.deadlock_file, {"id": dead_id, "by": self.rank, "beats": counts})
        self.exit_rank(deadlock_row(dead_id, counts)["message"])

    def blocked_peer(self) -> int | None:
        """A peer that will never reach the agreement this rank waits at (see the class), or None."""
        mine = self.counts()
        now = time.time()
        beats = self._beats(now)
        for peer, beat in beats.items():
            if peer == self.rank or now - beat["changed"] < STALL_S:
                continue  # still issuing
            if any(n > mine[key] for key, n in beat["counts"].items() if key in mine):
                return peer
        if self._all_quiet_s(beats, now) >= QUIET_S:
            return next(peer for peer in sorted(beats) if peer != self.rank)
        return None


def _main_thread_cpu() -> Callable[[], float | None]:
    """The CPU time of the calling (main) thread, readable from any thread; None where this
    platform cannot say (then the rank always counts as working: no case is ended for it)."""
    try:
        clock = time.pthread_getcpuclockid(threading.get_ident())
        time.clock_gettime(clock)
    except (AttributeError, OSError):
        return lambda: None
    return lambda: time.clock_gettime(clock)


def _exit_rank(why: str) -> None:
    """End this rank as the watchdog does (its stacks in the rank log first), its diagnosis
    said last (distci/harness/outcome.py's LAST_WORDS): a replayed case's Result carries it."""
    import faulthandler
    import sys

    from distci.harness.outcome import say_last_words

    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    say_last_words(why)
    os._exit(1)


def _write(path: Path, data: dict) -> None:
    """Whole or not at all: a rank killed mid-write leaves the previous file."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def dead_rows(flight: dict[str, Any], stuck: list[dict[str, Any]], world: int,
              deadlock: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows a resume slot records for what its dead predecessor was running.

    `flight` is the in-flight marker. The case that ended the slot (a shrink candidate, when
    it died while shrinking) is a find of its own: with the ranks' outcome when some ranks
    finished it (`stuck`: it raised on them only; the others never returned), else "the sweep
    died on this case" (a crash, or every rank held past the watchdog), or, when the ranks'
    pulses saw every rank stand still in it (`deadlock`: Pulse), a deadlock with each group's
    collectives issued by rank. A batch case whose shrinking it interrupted is recorded with its
    own failure and the shrink so far."""
    dead_id = flight.get("candidate") or flight["id"]
    if flight.get("probe"):  # the case ran and was agreed; the ranks fell out of step after it
        return [flight["probe"]] if not flight.get("candidate") else \
            [_interrupted(flight, f"the ranks fell out of step after shrink candidate {dead_id}")]
    mine = [s for s in stuck if s.get("id") == dead_id]
    if deadlock and deadlock.get("id") == dead_id:  # first: a rank it ended fails its peers' waits, who then file
        dead = deadlock_row(dead_id, deadlock["beats"])
    elif mine:
        finished = sorted(s["rank"] for s in mine)
        dead = hang_row(dead_id, next((s for s in mine if s["status"] == "fail"), mine[0]))
        dead["message"] = dead["message"].replace(
            "some ranks finished the case", f"ranks {finished} finished the case, ranks "
            f"{[r for r in range(world) if r not in finished]} never did", 1)
    else:  # the watchdog's limit passed (every rank held: a deadlock, or that slow), or a crash
        op = dead_id.split("~", 1)[0]
        held = time.time() - flight.get("started", time.time()) >= CASE_LIMIT_S
        signature = f"{op}: no rank finished the case within {CASE_LIMIT_S:.0f}s" if held else \
            f"{op}: the sweep died on this case"
        dead = {"id": dead_id, "status": "lost", "signature": signature,
                "message": f"{signature} ({'a deadlock, or a case that slow' if held else 'a rank crashed'}: the "
                           f"ranks' logs hold their stacks)\n  case {dead_id}", "seconds": 0.0, "died": True}
    if flight.get("candidate") and flight.get("record"):  # it died shrinking `record`'s case
        return [dead, _interrupted(flight, f"a shrink candidate ended the sweep: {dead_id}")]
    return [dead]


def deadlock_row(case_id: str, beats: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The row of a case in which every rank stood still in collectives (Pulse): `beats`, each
    rank's collectives issued per group. The groups whose members issued different counts say
    where the ranks parted (in a job: a hang)."""
    op = case_id.split("~", 1)[0]
    signature = f"{op}: every rank waits in a collective its peers never issue (a deadlock)"
    parted = []
    for key in sorted({k for counts in beats.values() for k in counts}):
        by_count: dict[int, list[int]] = {}
        for rank, counts in sorted(beats.items(), key=lambda kv: int(kv[0])):
            if key in counts:
                by_count.setdefault(counts[key], []).append(int(rank))
        if len(by_count) > 1:
            parted.append(f"group [{key}]: " + ", ".join(f"ranks {r} issued {n}" for n, r in sorted(by_count.items())))
    return {"id": case_id, "status": "fail", "signature": signature, "died": True, "seconds": 0.0,
            "message": f"{signature}\n  no rank issued a collective or used CPU for {QUIET_S:.0f}s; collectives issued "
                       f"per group: " + ("; ".join(parted) or "the same on every rank") + f"\n  case {case_id}"}


def hang_row(case_id: str, outcome: dict[str, Any], raised_on: list[int] | None = None,
             went_on: list[int] | None = None) -> dict[str, Any]:
    """The row of a case that ended on some ranks (`outcome`: one such rank's CaseOutcome
    fields) while the others never returned from its collectives: in a real job, a hang. The
    signature keeps the error and says so; "with empty shards raised on ranks" is what
    dtensor-max-empty-shard's repro prints, so a find of that bug through another op names the
    entry as its near miss (Registry.near_misses). `raised_on` / `went_on`: the ranks agreed
    right after the phase that some raised (suites/generators/ops_outcome.py): the same find,
    learnt at once instead of waited out (no slot died)."""
    op = case_id.split("~", 1)[0]
    signature = outcome.get("signature") or (
        f"{op}: a peer never reached the agreement after a phase (blocked in one of the op's "
        "collectives, or past its bound)" if outcome["status"] == WENT_ON else f"{op}: {outcome['status']}")
    during, _, error = signature.partition(" raised ")
    where = "with empty shards raised on ranks holding them only" if outcome.get("empty") else \
        "raised on some ranks only"
    signature = f"{during} {where}, the others hang: {error}" if error else f"{signature} (some ranks only, the others hang)"
    how = f"some ranks finished the case, the others never returned from its collectives within {HANG_S:.0f}s" \
        if raised_on is None else f"ranks {raised_on} raised, ranks {went_on} went on toward the case's next " \
                                  "collective (agreed on the side group right after)"
    return {"id": case_id, "status": "fail", "signature": signature[:240],
            "message": f"{signature[:240]}\n  {how} (a hang in a real job)\n"
                       + "\n".join("  " + line for line in (outcome.get("message") or "").splitlines()),
            "seconds": outcome.get("seconds", 0.0) if raised_on is not None else 0.0, "died": raised_on is None}


def _interrupted(flight: dict[str, Any], why: str) -> dict[str, Any]:
    """The row of the case whose shrinking the slot's end interrupted: its failure, shrunk so far."""
    record = flight["record"]
    best = flight.get("best") or {"id": record["id"], "message": record.get("message", "")}
    return {**record, "shrunk": {"id": best["id"], "message": best["message"], "steps": [], "checks": 0,
                                 "complete": False, "stopped": why}}
