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
                         unchanged (a Pulse: how a peer tells a rank blocked in the op's own
                         collective from one still working, without asking it)
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


PULSE_S = 0.5
"""How often a rank's Pulse writes its counts."""
STALL_S = 3.0
"""A peer whose counts stood still this long while ahead of this rank's is blocked (a case's
collective is milliseconds; a peer computing issues none, so it is never ahead)."""


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


class Pulse:
    """A rank's collectives issued per group (`counts`: group key -> count, the same keys on
    every rank), written every PULSE_S by a thread while the slot runs; `blocked_peer` reads the
    peers'. Why: a rank waiting at the raised-anywhere agreement cannot tell a peer blocked in a
    collective inside the op (clip_grad_norm's inf norm with an empty shard raises on its rank,
    the peers wait in the op's all-reduce: they never arrive) from a peer still in a slow op
    (sdpa's CPU propagation: it arrives), so it waited the largest bound any rank can hold
    (~45 s) before ending the slot. A peer that issued more collectives on a group than this
    rank did, and has issued none for STALL_S, waits in one this rank, done with the phase,
    never issues: that wait ends now. The thread reads counts only (no collective, no lock)."""

    def __init__(self, files: SweepFiles, rank: int, world: int, counts: Callable[[], dict[str, int]]) -> None:
        self.files, self.rank, self.world, self.counts = files, rank, world, counts
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
        changed = time.time()
        while not self._stop.is_set():
            try:
                now = self.counts()
            except Exception:  # a mesh cached while read: the next beat reads it
                now = last
            if now != last:
                last, changed = now, time.time()
            if last:
                _write(self.files.pulse_file(self.rank), {"counts": last, "changed": changed, "at": time.time()})
            self._stop.wait(PULSE_S)

    def blocked_peer(self) -> int | None:
        """A peer waiting in a collective this rank never issued (see the class), or None."""
        mine = self.counts()
        now = time.time()
        for peer in range(self.world):
            if peer == self.rank:
                continue
            try:
                beat = json.loads(self.files.pulse_file(peer).read_text())
            except (OSError, ValueError):
                continue
            if now - beat["at"] > 3 * PULSE_S + 1 or now - beat["changed"] < STALL_S:
                continue  # not beating (gone, or no counts on this torch), or still issuing
            if any(n > mine[key] for key, n in beat["counts"].items() if key in mine):
                return peer
        return None


def _write(path: Path, data: dict) -> None:
    """Whole or not at all: a rank killed mid-write leaves the previous file."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def dead_rows(flight: dict[str, Any], stuck: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    """The rows a resume slot records for what its dead predecessor was running.

    `flight` is the in-flight marker. The case that ended the slot (a shrink candidate, when
    it died while shrinking) is a find of its own: with the ranks' outcome when some ranks
    finished it (`stuck`: it raised on them only; the others never returned), else "the sweep
    died on this case" (a crash, or every rank held past the watchdog). A batch case whose
    shrinking it interrupted is recorded with its own failure and the shrink so far."""
    dead_id = flight.get("candidate") or flight["id"]
    if flight.get("probe"):  # the case ran and was agreed; the ranks fell out of step after it
        return [flight["probe"]] if not flight.get("candidate") else \
            [_interrupted(flight, f"the ranks fell out of step after shrink candidate {dead_id}")]
    mine = [s for s in stuck if s.get("id") == dead_id]
    if mine:
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
    signature = outcome.get("signature") or f"{op}: {outcome['status']}"
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
