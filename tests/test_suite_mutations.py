"""Mutation tests: the suites' checks must fail a run that is wrong in a quiet way.

Each mutation breaks a real 2-rank (gloo) training run the way bugs do in practice and
trains to completion without raising; the check must then report it:
  - a wrong plan: w2's row-parallel output left as partial sums (a missing all-reduce),
  - a dropped gradient: w1's gradient silently zeroed,
  - a Float8 conversion that did not happen (a filter that rejects every Linear),
  - async TP whose fusion did not happen (post-grad graphs without the fused ops; the
    checker is fed the evidence directly, as async TP itself needs CUDA).
Unmutated controls run through the same checks and must pass, so a failure is the
mutation's doing. All real runs share one spawn of two ranks (~30 s on 2 cores).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

RUNS = {
    # name: (scenario id, mutation)
    "control": ("tp-eager", None),
    "wrong_plan": ("tp-eager", "missing_reduction"),
    "dropped_grad": ("tp-eager", "zero_grad"),
    "control_f8": ("tp-eager-f8_rowwise", None),
    "no_float8": ("tp-eager-f8_rowwise", "no_conversion"),
}


def _mutation(kind: str | None):
    from suites.training import Mutation

    if kind is None:
        return None
    if kind == "missing_reduction":
        from torch.distributed.tensor import Partial
        from torch.distributed.tensor.parallel import RowwiseParallel

        return Mutation(block_plan_overrides={"feed_forward.w2": RowwiseParallel(output_layouts=Partial())})
    if kind == "zero_grad":
        def zero_w1_grad(model) -> None:
            model.layers["0"].feed_forward.w1.weight.register_hook(lambda g: g * 0)

        return Mutation(after_parallelize=zero_w1_grad)
    if kind == "no_conversion":
        return Mutation(float8_filter=lambda module, fqn: False)
    raise ValueError(kind)


def _rank_main(rank: int, world_size: int, out_dir: str) -> None:
    """One rank: every run of RUNS, its checks' problems written to <out_dir>/rank<N>.json."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from suites.checks import check_graph, check_numerics, expected_graph
    from suites.scenarios import MODEL, SCENARIOS, tolerance
    from suites.training import run_parallel, run_reference

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/pg", rank=rank, world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    device = torch.device("cpu")
    results = {}
    for name, (sid, kind) in RUNS.items():
        scenario = SCENARIOS[sid]
        try:
            ref = run_reference(scenario, device, "float32")
            run, evidence = run_parallel(scenario, mesh, device, "float32", _mutation(kind))
        except Exception as exc:  # noqa: BLE001 - reported: a mutation must not raise
            results[name] = {"raised": f"{type(exc).__name__}: {exc}"}
            continue
        results[name] = {
            "numerics": check_numerics(ref, run, tolerance("float32", scenario.float8)),
            "graph": check_graph(expected_graph(scenario, MODEL), evidence),
        }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def mutated(tmp_path_factory) -> dict:
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("mutations")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    mp.spawn(_rank_main, args=(2, str(out)), nprocs=2, join=True)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks[0] | {f"{k}@rank1": v for k, v in ranks[1].items()}


def _problems(results: dict, name: str, which: str) -> list[str]:
    entry = results[name]
    assert "raised" not in entry, f"{name} raised before its check: {entry['raised']}"
    return entry[which]


def test_controls_pass(mutated):
    for name in ("control", "control_f8"):
        assert _problems(mutated, name, "numerics") == []
        assert _problems(mutated, name, "graph") == []


def test_missing_reduction_fails_numerics(mutated):
    problems = _problems(mutated, "wrong_plan", "numerics")
    assert any("loss" in p for p in problems), problems
    assert _problems(mutated, "wrong_plan@rank1", "numerics"), "every rank must see the failure"


def test_dropped_gradient_fails_numerics(mutated):
    problems = _problems(mutated, "dropped_grad", "numerics")
    assert any("layers.0.feed_forward.w1.weight" in p and "all zero" in p for p in problems), problems


def test_float8_not_converted_fails_graph(mutated):
    problems = _problems(mutated, "no_float8", "graph")
    assert any("Float8 did not happen" in p for p in problems), problems
    assert any("Float8Linear modules" in p for p in problems), problems


def _async_tp_evidence(fused: bool):
    from suites.training import Evidence

    ops = Counter({"_c10d_functional::all_gather_into_tensor": 8, "aten::mm": 24,
                   "_c10d_functional::reduce_scatter_tensor": 8})
    if fused:
        ops = Counter({"symm_mem::fused_all_gather_matmul": 8, "symm_mem::fused_matmul_reduce_scatter": 8,
                       "aten::mm": 8})
    shards = {"layers.0.attention.wq.weight": "S0", "layers.0.feed_forward.w2.weight": "S1"}
    return Evidence(compiled=True, graphs_after_first_step=2, graphs_total=2, post_grad_graphs=4,
                    post_grad_ops=ops, placements=shards)


def test_async_tp_without_fusion_fails_graph():
    from suites.checks import check_graph, expected_graph
    from suites.scenarios import MODEL, SCENARIOS

    expect = expected_graph(SCENARIOS["tp_sp-compile_block-asynctp"], MODEL)
    assert check_graph(expect, _async_tp_evidence(fused=True)) == []
    problems = check_graph(expect, _async_tp_evidence(fused=False))
    assert any("did not fuse the all-gather side" in p for p in problems), problems
    assert any("did not fuse the reduce-scatter side" in p for p in problems), problems
