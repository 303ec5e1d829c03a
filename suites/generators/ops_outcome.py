"""One op case's outcome on a rank, and how the ranks agree on it (suites/generators/ops_cases.py
runs the case, suites/generators/ops_entry.py the sweep).

Every rank runs every case and judges it on its own; the ranks must then leave the case
together, or the next collective of one pairs with another collective of its peer. Two
agreements, both on the sweep's side group (its own timeout, never the group the case's
collectives use):

- *raised anywhere?* (on its own group: a peer may take its whole time bound to arrive, past
  the side group's timeout) right after each phase that can raise on some ranks only (distributing
  the inputs, the op, the backward: an empty shard makes the local op raise on the ranks
  holding it while their peers go on). Every rank learns it in one small all_reduce and
  leaves the case; before, the peers went on into the judge's collectives, the ranks that
  raised waited out the side group's timeout (30 s) and the harness's failure grace, and a
  resume slot recorded the case (about 45 s a case: docs/fuzz.md). A peer still blocked in a
  collective inside the op never reaches the agreement: the others give up after the case's
  time bound plus ASK_MARGIN_S and the slot ends as before (`PeersGone`).
- *the outcome*, after the case (`agree`, on the side group): the first failing rank's, else rank 0's. A case
  raised on some ranks only is the same find the hang path files (ops_sweep.hang_row's
  signature: "... raised on ranks holding them only, the others hang"), since in a job the
  peers would hang in their next collective.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any, Callable

from .ops_sweep import WENT_ON, hang_row


@dataclass
class CaseOutcome:
    status: str
    """pass | fail | gap | invalid | went_on (see WENT_ON)"""
    signature: str | None = None
    message: str = ""
    seconds: float = 0.0
    empty: bool = False
    """Some input's local shard on this rank is empty while the full input is not (what an
    error raised on some ranks only usually comes from)."""
    raised: bool = False
    """The DTensor side raised on this rank (agreed: on some rank), so the ranks may have
    issued different collectives: a sweep checks its groups are in step before going on."""


class PeersGone(Exception):
    """The raised-anywhere agreement timed out: a peer never left the phase (blocked in one of
    the op's collectives). Carries this rank's outcome, for the slot's stuck file."""

    def __init__(self, outcome: CaseOutcome) -> None:
        super().__init__(f"the ranks' raised-anywhere agreement timed out ({outcome.status})")
        self.outcome = outcome


RaisedAnywhere = Callable[[bool], bool]
"""Asked on every rank after a phase with whether it raised here; answers whether any rank did."""


ASK_MARGIN_S = 5.0
"""A peer gets its case's time bound plus this to reach the raised-anywhere agreement: a peer
spinning in Python is cut by its bound and answers; one blocked in a collective never does."""
ASKS_TIMEOUT_S = 600.0
"""The agreement group's own timeout, above any wait `raised_anywhere` asks for (each wait is
bounded by its own timeout; the group's only keeps gloo from cutting a longer one short)."""


FIRST_WAIT_S = 2.0
"""The agreement's first wait: past it, a rank also asks `blocked` once a second."""


def raised_anywhere(group, wait_s: float, blocked: Callable[[], int | None] | None = None) -> RaisedAnywhere:
    """The agreement over `group` (a gloo group of every rank, with ASKS_TIMEOUT_S, not the side
    group's short timeout: a peer may take its whole bound to arrive): one int all_reduce (MAX),
    waited for at most `wait_s` (the case's bound plus ASK_MARGIN_S), or until `blocked` names a
    peer waiting in a collective inside the op (ops_sweep.Pulse: it never arrives)."""
    import datetime
    import time

    import torch
    import torch.distributed as tdist

    def ask(mine: bool) -> bool:
        flag = torch.tensor([int(mine)])
        work = tdist.all_reduce(flag, op=tdist.ReduceOp.MAX, group=group, async_op=True)
        began = time.monotonic()
        step = min(FIRST_WAIT_S, wait_s) if blocked is not None else wait_s
        while True:
            try:
                if work.wait(timeout=datetime.timedelta(seconds=step)) is False:
                    raise TimeoutError(f"no answer within {wait_s:.0f}s")
                return bool(flag.item())
            except Exception:  # gloo raises on a wait's timeout; the all_reduce goes on behind it
                if work.is_completed():  # it ended as the wait did: its answer (or its error)
                    work.wait()
                    return bool(flag.item())
                left = wait_s - (time.monotonic() - began)
                if blocked is None or left <= 0:
                    raise
                peer = blocked()
                if peer is not None:
                    raise TimeoutError(f"rank {peer} waits in a collective of the op this rank never issued") \
                        from None
                step = min(1.0, left)

    return ask


def leave_if_raised(failed: CaseOutcome | None, ask: RaisedAnywhere | None) -> CaseOutcome | None:
    """After a phase: None to go on (no rank raised), else this rank's outcome of the case
    (`failed`, or WENT_ON where a peer raised). Without `ask` (no side group), `failed` as is."""
    if ask is None:
        return failed
    try:
        anyone = ask(failed is not None)
    except Exception:  # the side group's timeout: some peer never left the phase
        raise PeersGone(failed or CaseOutcome(WENT_ON, raised=False)) from None
    return (failed or CaseOutcome(WENT_ON)) if anyone else None


def agree(dist, outcome: CaseOutcome, group=None, case_id: str = "") -> CaseOutcome:
    """One outcome for all ranks: the first failing rank's (a local shape can be wrong on one
    rank only), else rank 0's; a case raised on some ranks only is that rank's error as the
    hang it is in a job (see the module's docstring). `group`: a side group of every rank
    (the sweep's, whose timeout tells a hang), so the agreement never pairs with a collective
    of a rank still in the case."""
    import torch.distributed as tdist

    everyone: list[Any] = [None] * dist.world_size
    tdist.all_gather_object(everyone, astuple(outcome), group=group)
    pick = CaseOutcome(*next((o for o in everyone if o[0] == "fail"), everyone[0]))
    pick.raised = any(o[-1] for o in everyone)
    went_on = [rank for rank, o in enumerate(everyone) if o[0] == WENT_ON]
    if went_on and pick.status == "fail":
        raised = [rank for rank in range(dist.world_size) if rank not in went_on]
        row = hang_row(case_id or "op", {**vars(pick)}, raised_on=raised, went_on=went_on)
        pick.signature, pick.message = row["signature"], row["message"]
    return pick
