"""Runs the ops generator's cases on the rank pool: many per test (a sweep), or one (a find).

Not collected with `suites/` (the file name is not test_*.py): `python -m distci fuzz
--generator ops` names it. Two tests:

- `test_op_sweep[ws2]`, `[ws4]`: every case of $DISTCI_OPS_CASES (a JSON file written by
  distci/fuzz/ops_command.py: the cases, where to write outcomes, shrink bounds) whose mesh
  needs that many ranks, one after another on the same ranks (a case costs milliseconds,
  a pytest session seconds: batching is what makes thousands an hour). A failure whose
  signature is new to the run is shrunk right there (distci/fuzz/ops.py's shrinker, each
  candidate a case like any other: the 1-D mesh of 2 runs on the tp submesh of a 2x2
  world). Rank 0 writes one JSON line per case as it finishes. The sweep passes whatever its
  cases did: the finds become Results of their own below. A case that kills or hangs its
  ranks ends the slot; the next *resume slot* (`[ws4-resume1]`, ... on fresh forks of the
  warm pool) records it and goes on with the cases after it (suites/generators/ops_sweep.py
  says how). A slot hands over to the next after SLOT_S, far inside its timeout (900 s).
  Each case runs under a time bound (suites/generators/case_bound.py): one that spins in
  Python fails in seconds with where it spun, and the sweep goes on.
- `test_op_case[<case id>]`: one case (its id names it entirely), failing with the case's
  problem, first line its signature: what a find is recorded as, what a repro reruns, what
  a known-issues entry matches. A capability gap or an invalid draw skips with the reason.
  The fuzz run replays its finds in the session its sweeps ran in: a batch file whose
  "finds" lists their ids (distci/harness/batches.py selects this test for that batch).

    python -m distci run --cell CELL --test 'suites/generators/ops_entry.py::test_op_case[<id>]'
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dataclasses import asdict

from distci.op_case import case_from_json, parse_case

from .ops_outcome import ASKS_TIMEOUT_S
from .ops_sweep import CASE_LIMIT_S, HANG_S, RESUME_SLOTS, SLOT_S, Pulse, SweepFiles, dead_rows, hang_row

CASES_ENV = "DISTCI_OPS_CASES"
CASE_ENV = "DISTCI_OPS_CASE"
PREFIX = "::test_op_case["


def _batch(path: str | None = None) -> dict:
    """The batch file `path` names, else $DISTCI_OPS_CASES's. Read in the controller: the
    sweep gets its file as a parameter, since the ranks' environment is the one their pool
    started with (a fuzz run's later sweeps run on the same pools, distci/harness/batches.py)."""
    path = path or os.environ.get(CASES_ENV)
    return json.loads(Path(path).read_text()) if path else {}


def _case_ids(args: list[str]) -> list[str]:
    """The cases `test_op_case` runs: $DISTCI_OPS_CASE, else the batch's finds (the fuzz run
    replays them in its session), else the ids the command line names."""
    if os.environ.get(CASE_ENV):
        return [os.environ[CASE_ENV]]
    return _batch().get("finds") or [a.split(PREFIX, 1)[1].rsplit("]", 1)[0] for a in args if PREFIX in a]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    name = metafunc.function.__name__
    if name == "test_op_sweep":
        sizes = sorted({case_from_json(c).world_size for c in _batch().get("cases", [])})
        path = os.environ.get(CASES_ENV, "")
        metafunc.parametrize("world,slot,batch_file", [
            pytest.param(n, k, path, id=f"ws{n}" + (f"-resume{k}" if k else ""), marks=[pytest.mark.world_size(n)])
            for n in sizes for k in range(RESUME_SLOTS + 1)])
    elif name == "test_op_case":
        cases = [parse_case(i) for i in _case_ids(list(metafunc.config.args))]
        metafunc.parametrize("case_id", [pytest.param(c.id, id=c.id, marks=[pytest.mark.world_size(c.world_size)])
                                         for c in cases])


@pytest.fixture(autouse=True)
def _resume_only_after_a_death(request: pytest.FixtureRequest) -> None:
    """In the controller, before a resume slot forks ranks: skip it when its world size's
    cases are all answered (the slot before did not die)."""
    slot = getattr(request.node, "callspec", None) and request.node.callspec.params.get("slot")
    params = slot and request.node.callspec.params
    if params and SweepFiles(Path(_batch(params["batch_file"])["out"]), params["world"]).done.exists():
        pytest.skip("nothing to resume: the sweep's earlier slot answered every case")


def _run(dist, case, plant, asks, blocked=None, base_s=None):
    """This rank's outcome of `case` (not agreed yet), under the case's time bound: a case that
    spins in Python fails with where it spun (suites/generators/case_bound.py). The ranks agree
    on `asks` after each phase whether one raised (suites/generators/ops_outcome.py); PeersGone
    (that agreement timed out, or `blocked` named a peer waiting in a collective of the op)
    goes to the caller with this rank's outcome. `base_s`: the bound's idle base (default
    case_bound.BASE_S; a batch's "bound_base_s")."""
    from .case_bound import BASE_S, LOAD_CAP, Bound, CaseTimeout, bound_s
    from .ops_cases import run_case, timed_out
    from .ops_outcome import ASK_MARGIN_S, CaseOutcome, PeersGone, leave_if_raised, raised_anywhere

    base_s = BASE_S if base_s is None else base_s
    bound = Bound(bound_s(case.shapes, base_s=base_s))
    # The wait for a peer: never shorter than the largest bound any rank can hold for this case
    # (each reads the load itself; LOAD_CAP is the most it reads) nor than the side group's
    # patience the sweep had before the agreement: a peer still inside a slow op (sdpa's CPU
    # propagation, a signal deferred in C++) is waited for, not left behind to cost a slot.
    wait_s = max(bound_s(case.shapes, load=LOAD_CAP, base_s=base_s), HANG_S) + ASK_MARGIN_S
    agreement = raised_anywhere(asks, wait_s, blocked)

    def ask(mine: bool) -> bool:
        with bound.paused():
            return agreement(mine)

    try:
        with bound:
            return run_case(case, dist, plant, ask)
    except CaseTimeout:  # the peers may wait at the phase's raised-anywhere agreement: answer it
        return leave_if_raised(timed_out(case, bound), agreement)
    except PeersGone:
        raise
    except Exception as exc:  # a bug of the judge itself: reported as the case's failure, never lost
        import traceback

        return CaseOutcome("fail", f"{case.op}: judge raised {type(exc).__name__}",
                           f"{case.op}: judge raised {type(exc).__name__}\n{traceback.format_exc()[-3000:]}")


class SweepStuck(RuntimeError):
    """This rank finished a case the other ranks never did: the slot ends, the next resumes."""


class OutOfStep(Exception):
    """Every rank knows the ranks' groups fell out of step: the slot ends quietly, the next resumes."""


def _modes() -> tuple[int, ...]:
    """How many dispatch and function modes are pushed (where this torch can say)."""
    import torch

    return tuple(getattr(torch._C, name, lambda: 0)() for name in ("_len_torch_dispatch_stack",
                                                                   "_len_torch_function_stack"))


def _issued(groups) -> dict[str, int]:
    """How many collectives this rank issued on each group (its ranks as the key, the same on
    every member), where this torch's process group counts them; {} where it cannot say."""
    import torch.distributed as tdist

    counts = {}
    for g in groups:
        try:
            counts[",".join(map(str, tdist.get_process_group_ranks(g)))] = int(g._get_sequence_number_for_group())
        except Exception:  # a backend or torch without the count: the barriers still decide
            continue
    return counts


def _groups(dist) -> dict:
    """Every group a case could have used: the world, each cached mesh's axes."""
    import torch.distributed as tdist

    return {id(g): g for g in [tdist.group.WORLD] + [m.get_group(a) for m in list(dist._meshes.values())
                                                        for a in range(m.ndim)]}


def _in_step(dist, side, hang_s: float, modes: tuple[int, ...]) -> bool:
    """Whether every group a case could have used (the world, each cached mesh's axes) is in
    step on every rank, and no rank has a mode pushed that was not there when the slot began
    (`modes`), agreed on the side group. Only asked after a case that raised somewhere: a rank
    that raised may have left a collective issued that its peers never issued, and the next
    case would pair with it (or hang in it); a case its time bound cut inside torch's
    bookkeeping (a mode's __exit__) may have left the mode on for the rest.

    In step: the members of each group issued as many collectives on it (gloo and NCCL count
    them), then each group completes a barrier within `hang_s`. The count comes first because
    a barrier alone can pass out of step: gloo pairs a rank's next collective with whatever
    its peer issued last, whatever the kind (checked on 2.13: a functional all_reduce on one
    rank completed against a plain async all_reduce only its peer had issued)."""
    import datetime

    import torch.distributed as tdist

    groups = _groups(dist)
    counted: list = [None] * dist.world_size
    tdist.all_gather_object(counted, _issued(groups.values()), group=side)
    by_group: dict[str, set[int]] = {}
    for counts in counted:
        for key, n in counts.items():
            by_group.setdefault(key, set()).add(n)
    if any(len(ns) > 1 for ns in by_group.values()):
        return False  # the same answer on every rank: each gathered every rank's counts
    works = [tdist.barrier(group=g, async_op=True) for g in groups.values()]
    ok = True
    for work in works:
        try:
            work.wait(timeout=datetime.timedelta(seconds=hang_s))
        except Exception:
            ok = False
    ok = ok and _modes() == modes
    everyone: list = [None] * dist.world_size
    tdist.all_gather_object(everyone, ok, group=side)
    return all(everyone)


def _agreed_clock(side):
    """Rank 0's clock, read on every rank (a broadcast on the side group per reading). The
    sweep stops a slot, and stops shrinking, by time: read on each rank's own clock, one rank
    can run one more case or candidate than its peers, whose collectives then never pair (one
    rank shrinking while the other went on left both in the 300 s watchdog)."""
    import torch.distributed as tdist

    def now() -> float:
        box = [time.monotonic()]
        tdist.broadcast_object_list(box, src=0, group=side)
        return box[0]

    return now


@pytest.mark.dist_timeout(900)
def test_op_sweep(dist, world, slot, batch_file) -> None:
    import datetime
    import faulthandler
    import sys

    import torch.distributed as tdist

    from distci.op_shrink import shrink

    from .ops_outcome import agree
    from .ops_plants import planted

    batch = _batch(batch_file)
    plant = planted()
    files = SweepFiles(Path(batch["out"]), dist.world_size)
    hang_s, case_limit_s = batch.get("hang_s", HANG_S), batch.get("case_limit_s", CASE_LIMIT_S)
    answered, flight, stuck, deadlock = files.answered(), files.in_flight(), files.stuck(), files.deadlock()
    dead = {flight["id"], flight.get("candidate")} if flight and flight["id"] not in answered else set()
    files.pulse_file(dist.rank).unlink(missing_ok=True)  # a dead slot's, of groups gone with it
    # every rank has read the files before rank 0 writes to them
    side = tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=hang_s))
    asks = tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=ASKS_TIMEOUT_S))
    tdist.barrier(group=side)
    modes = _modes()
    seen = set(batch.get("known_signatures", []))
    bounds = batch.get("shrink", {})
    sink = open(files.rows, "a") if dist.rank == 0 else None
    # every rank learns the dead case's signature (what it read before the barrier is the
    # same everywhere): whether a later failure is shrunk depends on `seen`, and a rank that
    # shrinks while its peers go on runs other collectives than theirs (the 300 s watchdog)
    for row in dead_rows(flight, stuck, dist.world_size, deadlock) if dead else []:
        seen.add(row["signature"])
        if sink:
            sink.write(json.dumps(row) + "\n")
    if sink:
        sink.flush()
        files.clear_stuck()
        files.deadlock_file.unlink(missing_ok=True)
    cases = [c for c in map(case_from_json, batch["cases"])
             if c.world_size == dist.world_size and c.id not in answered and c.id not in dead]
    shrunk_s = 0.0  # a sweep shrinks for at most bounds["sweep_s"]: later finds come unshrunk, never a timeout
    now = _agreed_clock(side)  # every decision by time below is the same on every rank
    slot_began = now()

    def check(case, parent=None, record=None, best=None):
        """One case on every rank, agreed; a rank whose peers never finish it ends the slot."""
        if sink:
            files.begin(parent or case.id, case.id if parent else None, record, best)
        faulthandler.dump_traceback_later(case_limit_s, exit=True, file=sys.stderr)
        try:
            mine = None
            try:
                mine = _run(dist, case, plant, asks, pulse.blocked_peer, batch.get("bound_base_s"))
                pulse.settling = True
                agreed = agree(dist, mine, side, case.id)
            except Exception as exc:  # PeersGone (carries this rank's outcome), or the agreement's timeout
                mine = getattr(exc, "outcome", mine)
                files.write_stuck(dist.rank, case.id, asdict(mine))
                raise SweepStuck(f"case {case.id}: this rank finished it, some other rank did not within {hang_s:.0f}s "
                                 f"({type(exc).__name__}: {str(exc)[:200]})") from None
            finally:
                pulse.settling = False
            if agreed.raised:  # the ranks may have issued different collectives: in step still?
                if sink:
                    row = {"id": case.id, "status": agreed.status, "signature": agreed.signature,
                           "message": agreed.message, "seconds": round(agreed.seconds, 4)}
                    files.begin(parent or case.id, case.id if parent else None, record, best, probe=row)
                if not _in_step(dist, side, hang_s, modes):
                    raise OutOfStep()
        finally:
            faulthandler.cancel_dump_traceback_later()
        return agreed

    pulse = Pulse(files, dist.rank, dist.world_size, lambda: _issued(_groups(dist).values()))
    try:
        pulse.__enter__()
        for case in cases:
            if now() - slot_began > batch.get("slot_s", SLOT_S):  # the next slot goes on
                if sink:
                    files.end()
                return
            o = check(case)
            record = {"id": case.id, "status": o.status, "signature": o.signature, "message": o.message,
                      "seconds": round(o.seconds, 4)}
            shrinking_left = bounds.get("sweep_s", 240.0) - shrunk_s
            if o.status == "fail" and o.signature not in seen and bounds.get("max_checks", 1) and shrinking_left > 0:
                began = now()
                seen.add(o.signature)
                best = {"id": case.id, "message": o.message}

                def candidate(c, record=record, best=best, signature=o.signature):
                    got = check(c, case.id, record, best)
                    if got.status == "fail" and got.signature == signature:  # shrink() keeps it: the new best
                        best.update(id=c.id, message=got.message)
                    return _as_check(got)

                done = shrink(case, o.signature, candidate, max_checks=bounds.get("max_checks", 300),
                              max_s=min(bounds.get("max_s", 120.0), shrinking_left), clock=now, message=o.message)
                record["shrunk"] = {"id": done.case.id, "message": done.message, "steps": done.steps,
                                    "checks": done.checks, "complete": done.complete}
                shrunk_s += now() - began
            if sink:
                sink.write(json.dumps(record) + "\n")
                sink.flush()
        if sink:
            files.end()
            files.done.touch()
    except OutOfStep:  # on every rank: the next slot records the case in flight and goes on
        return
    finally:
        pulse.__exit__()
        if sink:
            sink.close()


def _replay_folder(dist, side) -> Path:
    """Where one replayed case's pulses meet: beside the fuzz run's sweeps when a batch file
    names them, else a folder rank 0 makes (a run dir's tmp is not shared knowledge here),
    its path broadcast on the side group."""
    import tempfile

    import torch.distributed as tdist

    out = _batch().get("out")
    box = [None]
    if dist.rank == 0:
        box[0] = str(Path(out) / "replay") if out else tempfile.mkdtemp(prefix="distci-op-case-")
        Path(box[0]).mkdir(parents=True, exist_ok=True)
    tdist.broadcast_object_list(box, src=0, group=side)
    return Path(box[0])


def _as_check(outcome) -> tuple[str | None, str]:
    return (outcome.signature if outcome.status == "fail" else None), outcome.message


def test_op_case(dist, case_id) -> None:
    import datetime

    import torch.distributed as tdist

    from .ops_outcome import agree
    from .ops_plants import planted

    side = tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=HANG_S))
    asks = tdist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=ASKS_TIMEOUT_S))
    folder = _replay_folder(dist, side)
    files = SweepFiles(folder, dist.world_size)
    if dist.rank == 0:
        files.begin(case_id)
    tdist.barrier(group=side)
    # the sweep's evidence in the replay too: a case every rank deadlocks in ends in seconds
    # with the deadlock's diagnosis as its Result's message (the Pulse's last words), which the
    # registry matches, instead of the harness's timeout and a bare hang
    pulse = Pulse(files, dist.rank, dist.world_size, lambda: _issued(_groups(dist).values()))
    mine = None
    try:
        pulse.__enter__()
        mine = _run(dist, parse_case(case_id), planted(), asks, pulse.blocked_peer)
        pulse.settling = True
        o = agree(dist, mine, side, case_id)
    except Exception as exc:  # this rank finished, another never returned from the case's collectives
        raise AssertionError(hang_row(case_id, asdict(getattr(exc, "outcome", mine)))["message"]) from None
    finally:
        pulse.__exit__()
    tdist.barrier(group=side)  # every rank's pulse is off before rank 0 clears the folder
    if dist.rank == 0:
        files.end()
        if not _batch().get("out"):
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    if o.status in ("gap", "invalid"):
        pytest.skip(f"{o.status}: {o.signature or ''} {o.message.splitlines()[0] if o.message else ''}".strip())
    if o.status == "fail":
        raise AssertionError(o.message)
