"""suites/runner/checkpoint.shared_dir on 2 real gloo ranks: a rank that leaves it with an
exception raises at once, while its peer is blocked in a collective the failed rank never
joins (a load that raised on rank 0 only). With a barrier on the way out, rank 0 waited
for the peer until the test's deadline and the record held the hang's stacks instead of
rank 0's error (found on torch 2.15 by the programs generator: dsd-set-model-state-dict-
mutates-input); and a clean exit still meets every rank and removes the directory."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _rank(rank: int, init: str, fail: bool, out) -> None:
    sys.path.insert(0, str(REPO))
    import torch
    import torch.distributed as dist

    from suites.runner.checkpoint import shared_dir

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    start = time.monotonic()
    try:
        with shared_dir() as where:
            out.put(("dir", rank, where))
            if fail and rank == 0:
                raise ValueError("rank 0 failed first")
            if fail:
                dist.broadcast(torch.zeros(1), src=0)  # rank 0 never comes
            elif rank == 1:  # rank 0 is at the way out by now: it must wait for this rank
                time.sleep(1.0)
                out.put(("inside", rank, Path(where).exists()))
    except ValueError as exc:
        out.put(("raised", rank, f"{exc} after {time.monotonic() - start:.1f} s"))
        return
    out.put(("left", rank, None))
    dist.destroy_process_group()


def _run(tmp_path: Path, fail: bool) -> tuple[list, list]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tmp_path / 'store'}"
    ranks = [ctx.Process(target=_rank, args=(r, init, fail, out)) for r in (0, 1)]
    for p in ranks:
        p.start()
    got, deadline = [], time.monotonic() + 90
    want = 3 if fail else 5
    while len(got) < want and time.monotonic() < deadline:
        try:
            got.append(out.get(timeout=1))
        except Exception:  # noqa: BLE001 - queue.Empty: keep waiting until the deadline
            if not any(p.is_alive() for p in ranks):
                break
    for p in ranks:
        p.kill()
        p.join()
    return got, ranks


@pytest.mark.slow
def test_a_rank_that_raises_leaves_at_once_and_a_clean_exit_meets_every_rank(tmp_path):
    got, _ = _run(tmp_path, fail=True)
    raised = [g for g in got if g[0] == "raised"]
    assert raised, f"rank 0 never left shared_dir with its error: {got}"
    _, rank, text = raised[0]
    assert rank == 0 and float(text.split(" after ")[1].split()[0]) < 10, text
    where = next(g[2] for g in got if g[0] == "dir")
    assert not os.path.exists(where), "rank 0 left its directory behind"
    (tmp_path / "clean").mkdir()
    got, _ = _run(tmp_path / "clean", fail=False)
    assert sorted(g[:2] for g in got if g[0] == "left") == [("left", 0), ("left", 1)], got
    assert ("inside", 1, True) in got, f"the directory was removed before every rank was done: {got}"
    assert not os.path.exists(next(g[2] for g in got if g[0] == "dir")), "a clean exit left the directory"
