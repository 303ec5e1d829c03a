"""Runs the ops generator's cases on the rank pool: many per test (a sweep), or one (a find).

Not collected with `suites/` (the file name is not test_*.py): `python -m distci fuzz
--generator ops` names it. Two tests:

- `test_op_sweep[ws2]`, `[ws4]`: every case of $DISTCI_OPS_CASES (a JSON file written by
  distci/fuzz/ops_command.py: the cases, where to write outcomes, shrink bounds) whose mesh
  needs that many ranks, one after another on the same ranks (a case costs milliseconds,
  a pytest session seconds: batching is what makes thousands an hour). A failure whose
  signature is new to the run is shrunk right there (distci/fuzz/ops.py's shrinker, each
  candidate a case like any other: the 1-D mesh of 2 runs on the tp submesh of a 2x2
  world). Rank 0 writes one JSON line per case as it finishes, so a crash loses one case.
  The sweep passes whatever its cases did: the finds become Results of their own below.
  Its timeout (900 s) holds a sweep sized to 150 s plus 240 s of shrinking: only a case
  that hangs its ranks (an error raised on some ranks only) runs into it.
- `test_op_case[<case id>]`: one case (its id names it entirely), failing with the case's
  problem, first line its signature: what a find is recorded as, what a repro reruns, what
  a known-issues entry matches. A capability gap or an invalid draw skips with the reason.

    python -m distci run --cell CELL --test 'suites/generators/ops_entry.py::test_op_case[<id>]'
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from distci.op_case import case_from_json, parse_case

CASES_ENV = "DISTCI_OPS_CASES"
CASE_ENV = "DISTCI_OPS_CASE"
PREFIX = "::test_op_case["


def _batch() -> dict:
    path = os.environ.get(CASES_ENV)
    return json.loads(Path(path).read_text()) if path else {}


def _case_ids(args: list[str]) -> list[str]:
    if os.environ.get(CASE_ENV):
        return [os.environ[CASE_ENV]]
    return [a.split(PREFIX, 1)[1].rsplit("]", 1)[0] for a in args if PREFIX in a]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    name = metafunc.function.__name__
    if name == "test_op_sweep":
        sizes = sorted({case_from_json(c).world_size for c in _batch().get("cases", [])})
        metafunc.parametrize("world", [pytest.param(n, id=f"ws{n}", marks=[pytest.mark.world_size(n)])
                                       for n in sizes])
    elif name == "test_op_case":
        cases = [parse_case(i) for i in _case_ids(list(metafunc.config.args))]
        metafunc.parametrize("case_id", [pytest.param(c.id, id=c.id, marks=[pytest.mark.world_size(c.world_size)])
                                         for c in cases])


def _agreed(dist, case, plant):
    from .ops_cases import CaseOutcome, agree, run_case

    try:
        outcome = run_case(case, dist, plant)
    except Exception as exc:  # a bug of the judge itself: reported as the case's failure, never lost
        import traceback

        outcome = CaseOutcome("fail", f"{case.op}: judge raised {type(exc).__name__}",
                              f"{case.op}: judge raised {type(exc).__name__}\n{traceback.format_exc()[-3000:]}")
    return agree(dist, outcome)


@pytest.mark.dist_timeout(900)
def test_op_sweep(dist, world) -> None:
    from distci.fuzz.ops import shrink

    from .ops_plants import planted

    batch = _batch()
    plant = planted()
    cases = [c for c in map(case_from_json, batch["cases"]) if c.world_size == dist.world_size]
    seen = set(batch.get("known_signatures", []))
    bounds = batch.get("shrink", {})
    out = Path(batch["out"]) / f"ws{dist.world_size}.jsonl"
    sink = open(out, "a") if dist.rank == 0 else None
    shrunk_s = 0.0  # a sweep shrinks for at most bounds["sweep_s"]: later finds come unshrunk, never a timeout
    try:
        for case in cases:
            o = _agreed(dist, case, plant)
            record = {"id": case.id, "status": o.status, "signature": o.signature, "message": o.message,
                      "seconds": round(o.seconds, 4)}
            shrinking_left = bounds.get("sweep_s", 240.0) - shrunk_s
            if o.status == "fail" and o.signature not in seen and bounds.get("max_checks", 1) and shrinking_left > 0:
                began = time.monotonic()
                seen.add(o.signature)
                done = shrink(case, o.signature, lambda c: _as_check(_agreed(dist, c, plant)),
                              max_checks=bounds.get("max_checks", 300),
                              max_s=min(bounds.get("max_s", 120.0), shrinking_left),
                              message=o.message)
                record["shrunk"] = {"id": done.case.id, "message": done.message, "steps": done.steps,
                                    "checks": done.checks, "complete": done.complete}
                shrunk_s += time.monotonic() - began
            if sink:
                sink.write(json.dumps(record) + "\n")
                sink.flush()
    finally:
        if sink:
            sink.close()


def _as_check(outcome) -> tuple[str | None, str]:
    return (outcome.signature if outcome.status == "fail" else None), outcome.message


def test_op_case(dist, case_id) -> None:
    from .ops_plants import planted

    o = _agreed(dist, parse_case(case_id), planted())
    if o.status in ("gap", "invalid"):
        pytest.skip(f"{o.status}: {o.signature or ''} {o.message.splitlines()[0] if o.message else ''}".strip())
    if o.status == "fail":
        raise AssertionError(o.message)
