"""Mutation tests: the suites' checks must fail a run that is wrong in a quiet way.

Each mutation breaks a real 2-rank (gloo) training run the way bugs do in practice and
trains to completion without raising; the check must then report it:
  - a wrong plan: w2's row-parallel output left as partial sums (a missing all-reduce),
  - a dropped gradient: w1's gradient silently zeroed,
  - a Float8 conversion that did not happen (a filter that rejects every Linear),
  - async TP whose fusion did not happen (post-grad graphs without the fused ops; the
    checker is fed the evidence directly, as async TP itself needs CUDA),
  - FSDP2 blocks that never reshard (fewer all-gathers than the plan implies),
  - a frozen weight that trains again (it requires grad and gets a gradient),
  - a MoE expert whose output is dropped,
  - a router that sends tokens elsewhere than the reference's (a skewed bias: the
    routing comparison, not only the gradients, must say so),
  - a resumed run whose checkpoint load did nothing,
  - varlen training without automatic dynamic shapes (a recompile per shape: over the
    budget),
and, fed evidence or records directly (what CPU cannot produce or is cheap to state):
FSDP2 float8 weight all-gathers that move high precision, a step that ran eager (a
recompile limit hit without fullgraph, as the FSDP2 whole-model rows compile; with
fullgraph=True Dynamo raises instead), an eval forward that ran
eager, compiled new graphs, or computed other numbers, missing reduce-scatters, a
parameter FSDP2 left unsharded, a router that never leaves an expert idle or starves one,
a routing edge (an expert starved in one microbatch) that did not happen. The structural
checks of the training step run for real too: FSDP2 gradient reductions in bf16 where the
MixedPrecisionPolicy says float32 (numbers alone stay inside the bf16 tolerance),
clipping by each rank's local norm (the 2-norm and the inf norm), a parameter that stops
requiring grad, a pipeline schedule that sums its microbatches' gradients, a foreach or fused
optimizer that silently steps with the per-parameter loop (same numbers: only the kernels the
last optimizer step ran see it), grad_sync=last accumulation whose FSDP2 still
reduce-scatters every microbatch (same numbers: only the recorded reductions see it), an
exported full state dict made of each rank's local shards, a tied output projection that a
layout untied (two parameters where the model has one); fed evidence: an uneven row whose
layout split no parameter unevenly; DDP and replicate grad_sync=last
accumulation that all-reduces in every microbatch (no no_sync), DDP gradients all-reduced in bf16
where the row says float32, a compiled DDP model without DDPOptimizer (one graph, not split at
the buckets); a model loaded on the meta device (init=meta_load) whose rotary cache, a buffer no
state dict carries, was left as to_empty left it (every step's loss differs, from the first);
an fp16 row whose GradScaler is disabled (the overflowing step is taken); a prefetch=explicit
row whose blocks kept FSDP2's implicit order (same numbers, block 1 gathered a block late).
Unmutated controls run through the same checks and must pass, so a failure is the
mutation's doing. All real runs share two ranks, forked from one fresh interpreter that
imported torch and the suites once for both, and each scenario's single-process reference is
computed once, by one rank, for every run of it on both (~60 s on 2 cores).
"""

from __future__ import annotations

import re

import datetime
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

VARLEN = "tp-compile_model_eager-varlen"
"""Not a table row: the cheapest compiled varlen run (Dynamo without AOTAutograd)."""

RUNS = {
    # name: (scenario id, mutation)
    "control": ("tp-eager", None),
    "wrong_plan": ("tp-eager", "missing_reduction"),
    "dropped_grad": ("tp-eager", "zero_grad"),
    "control_f8": ("tp-eager-f8_rowwise", None),
    "no_float8": ("tp-eager-f8_rowwise", "no_conversion"),
    "control_fsdp": ("fsdp-eager", None),
    "fsdp_no_reshard": ("fsdp-eager", "no_reshard"),
    "control_lora": ("tp-eager-lora", None),
    "unfrozen": ("tp-eager-lora", "unfreeze_embedding"),
    "control_moe": ("tp-moe-eager", None),
    "dropped_expert": ("tp-moe-eager", "drop_expert"),
    "misrouted": ("tp-moe-eager", "skew_router"),
    "control_dcp": ("tp_sp-eager-dcp_to_fsdp", None),
    "dcp_no_load": ("tp_sp-eager-dcp_to_fsdp", "skip_load"),
    "control_varlen": (VARLEN, None),
    "varlen_static": (VARLEN, "static_shapes"),
    "control_mp": ("fsdp-eager-mp_bf16", None),
    "reduce_in_bf16": ("fsdp-eager-mp_bf16", "reduce_in_bf16"),
    "control_clip": ("fsdp-eager-clip_norm", None),
    "clip_local_norm": ("fsdp-eager-clip_norm", "clip_local_norm"),
    "lost_requires_grad": ("fsdp-eager", "lose_requires_grad"),
    "control_pp": ("pp-gpipe-eager-ga2", None),
    "pp_summed": ("pp-gpipe-eager-ga2", "pp_sum_microbatches"),
    "control_ep_fsdp": ("ep_fsdp-moe-eager", None),
    "ep_default_divide": ("ep_fsdp-moe-eager", "ep_default_divide"),
    "export_local": ("fsdp-eager", "export_local_shards"),
    "control_fused": ("fsdp-eager-opt_fused-adamw", None),
    "fused_as_loop": ("fsdp-eager-opt_fused-adamw", "optimizer_for_loop"),
    "control_foreach": ("tp-eager-opt_foreach", None),
    "foreach_as_loop": ("tp-eager-opt_foreach", "optimizer_for_loop"),
    "control_clip_inf": ("fsdp-eager-clip_inf", None),
    "clip_inf_local_norm": ("fsdp-eager-clip_inf", "clip_local_norm"),
    "control_sync_last": ("fsdp-eager-ga2-sync_last", None),
    "sync_every_microbatch": ("fsdp-eager-ga2-sync_last", "sync_every_microbatch"),
    "control_tied": ("tp-eager-tied", None),
    "untied": ("tp-eager-tied", "untie"),
    "control_tied_fsdp": ("fsdp-eager-tied", None),
    "control_uneven": ("fsdp-eager-uneven", None),
    "control_ddp": ("ddp-eager-ga2-sync_last", None),
    "ddp_sync_every_microbatch": ("ddp-eager-ga2-sync_last", "sync_every_microbatch"),
    "ddp_reduce_in_bf16": ("ddp-eager-ga2-sync_last", "ddp_bf16_hook"),
    "control_replicate": ("replicate-eager-ga2-sync_last", None),
    "replicate_sync_every_microbatch": ("replicate-eager-ga2-sync_last", "sync_every_microbatch"),
    "control_ddp_compiled": ("ddp-compile_model_aot_eager", None),
    "ddp_without_ddp_optimizer": ("ddp-compile_model_aot_eager", "no_ddp_optimizer"),
    "control_meta_load": ("fsdp-eager-tied-meta_load", None),
    "meta_load_buffers_left_empty": ("fsdp-eager-tied-meta_load", "meta_load_keeps_buffers"),
    "control_fp16": ("fsdp-eager-mp_fp16-ga2", None),
    "fp16_scaler_disabled": ("fsdp-eager-mp_fp16-ga2", "scaler_disabled"),
    "control_prefetch": ("fsdp-eager-prefetch", None),
    "prefetch_ignored": ("fsdp-eager-prefetch", "prefetch_ignored"),
}


def _scenario(sid: str):
    from suites.scenario.table import SCENARIOS, Scenario

    if sid == VARLEN:
        return Scenario(parallel="tp", compile="model", backend="eager", shapes="varlen")
    return SCENARIOS[sid]


def _mutation(kind: str | None):
    from suites.runner.evidence import Mutation

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
    if kind == "no_reshard":
        return Mutation(fsdp_reshard=False)
    if kind == "unfreeze_embedding":
        return Mutation(after_parallelize=lambda model: model.tok_embeddings.weight.requires_grad_(True))
    if kind == "drop_expert":
        def drop(model) -> None:
            model.layers["0"].feed_forward.experts[1].register_forward_hook(lambda mod, inp, out: out * 0)

        return Mutation(after_parallelize=drop)
    if kind == "skew_router":
        import torch

        def skew(model) -> None:
            bias = model.layers["0"].feed_forward.router.bias
            with torch.no_grad():
                (bias.to_local() if hasattr(bias, "to_local") else bias)[0] += 3.0

        return Mutation(after_parallelize=skew)
    if kind == "skip_load":
        return Mutation(skip_checkpoint_load=True)
    if kind == "static_shapes":
        return Mutation(dynamo_config={"automatic_dynamic_shapes": False})
    if kind == "reduce_in_bf16":
        import torch

        return Mutation(fsdp_reduce_dtype=torch.bfloat16)
    if kind == "clip_local_norm":
        return Mutation(clip_local_norm=True)
    if kind == "pp_sum_microbatches":
        return Mutation(pp_sum_microbatches=True)
    if kind == "ep_default_divide":
        return Mutation(ep_default_divide=True)
    if kind == "export_local_shards":
        return Mutation(export_local_shards=True)
    if kind == "optimizer_for_loop":
        return Mutation(optimizer_impl="for_loop")
    if kind == "sync_every_microbatch":
        return Mutation(sync_every_microbatch=True)
    if kind == "prefetch_ignored":
        return Mutation(prefetch_ignored=True)
    if kind == "ddp_bf16_hook":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        def bf16_everywhere(state, bucket):  # its own name: DDP refuses bf16_compress_hook itself without NCCL
            return bf16_compress_hook(state, bucket)

        return Mutation(ddp_hook=bf16_everywhere)
    if kind == "no_ddp_optimizer":
        return Mutation(dynamo_config={"optimize_ddp": False})
    if kind == "lose_requires_grad":
        return Mutation(after_parallelize=lambda model: model.norm.weight.requires_grad_(False))
    if kind == "scaler_disabled":
        import torch

        return Mutation(grad_scaler=lambda device, **kw: torch.amp.GradScaler(device, enabled=False, **kw))
    if kind == "meta_load_keeps_buffers":
        return Mutation(meta_load_keeps_buffers=True)
    if kind == "untie":
        import torch

        def untie(model) -> None:  # a layout that re-distributes the output's weight on its own
            model.output.weight = torch.nn.Parameter(model.output.weight.detach().clone())

        return Mutation(after_parallelize=untie)
    raise ValueError(kind)


def _rank_main(rank: int, world_size: int, out_dir: str) -> None:
    """One rank: every run of RUNS, its checks' problems written to <out_dir>/rank<N>.json."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from suites.judges.checks import check_graph, check_numerics, check_routing, expected_graph
    from suites.judges.tolerances import tolerance
    from suites.runner.training import run_parallel

    torch.set_num_threads(1)
    # A bounded process-group timeout: a run that raises on one rank only must fail the
    # other rank's next collective, never hang the module.
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/pg", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=180))
    device = torch.device("cpu")
    results = {}
    meshes = {}

    def mesh_for(shape=None, names=None):
        key = (tuple(shape or (world_size,)), tuple(names or ()))
        if key not in meshes:
            meshes[key] = init_device_mesh("cpu", key[0], **({"mesh_dim_names": key[1]} if key[1] else {}))
        return meshes[key]

    refs = _references(rank, world_size, out_dir, device)
    for name, (sid, kind) in RUNS.items():
        scenario = _scenario(sid)
        try:
            import torch._dynamo

            ref = refs[sid]
            if isinstance(ref, str):
                raise RuntimeError(f"the reference raised: {ref}")
            torch._dynamo.reset()
            run, evidence = run_parallel(scenario, mesh_for, device, "float32", _mutation(kind))
        except Exception as exc:  # noqa: BLE001 - reported: a mutation must not raise
            results[name] = {"raised": f"{type(exc).__name__}: {exc}"}
            continue
        results[name] = {
            "numerics": check_numerics(ref, run, tolerance(scenario.compute_dtype or "float32",
                                                           scenario.float8)) + check_routing(ref),
            "graph": check_graph(expected_graph(scenario, "float32"), evidence),
        }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def _references(rank: int, world_size: int, out_dir: str, device) -> dict:
    """Each scenario's single-process reference (or what it raised), computed once for every run
    of the scenario on both ranks: a reference is a pure function of its scenario (seeded weights
    and batches, one thread, eager), so rank r computes every world_size-th scenario's and both
    read them all back. Each run recomputed it before (51 runs x 2 ranks for 27 scenarios)."""
    import torch
    import torch.distributed as dist

    from suites.runner.reference import run_reference

    sids = sorted({sid for sid, _ in RUNS.values()})
    for sid in sids[rank::world_size]:
        try:
            ref = run_reference(_scenario(sid), device, "float32")
        except Exception as exc:  # noqa: BLE001 - reported by each of its runs
            ref = f"{type(exc).__name__}: {exc}"
        torch.save(ref, Path(out_dir, f"reference-{sid}.pt"))
    dist.barrier()
    return {sid: torch.load(Path(out_dir, f"reference-{sid}.pt"), weights_only=False) for sid in sids}


def _fork_ranks(world_size: int, out_dir: str) -> None:
    """In a fresh interpreter (the `mutated` fixture's child): import torch and what the ranks
    run once, then fork the ranks from it. Spawned ranks imported them each (~3.6 CPU-s a rank);
    the pytest process itself may not fork them, as an earlier test of its worker may have run
    torch's OpenMP pool (a fork after that can hang the child). Nothing here runs an op."""
    import torch.multiprocessing as mp

    import suites.judges.checks  # noqa: F401 - what every rank imports, imported before the fork
    import suites.runner.reference  # noqa: F401
    import suites.runner.training  # noqa: F401
    import suites.scenario.table  # noqa: F401
    # imported lazily by some runs (Float8 rows, aot_eager's graph CSE, checkpoints, pipelines):
    # ~0.9 CPU-s a rank when each rank imported them itself
    import torch._inductor.pattern_matcher  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.pipelining  # noqa: F401
    import torchao.float8  # noqa: F401

    mp.start_processes(_forked_rank, args=(world_size, out_dir), nprocs=world_size, join=True,
                       start_method="fork")


def _forked_rank(rank: int, world_size: int, out_dir: str) -> None:
    from distci.harness import procs

    procs.die_with_parent()  # a fork does not inherit it: the ranks end with the process that forked them
    _rank_main(rank, world_size, out_dir)


@pytest.fixture(scope="module")
def mutated(tmp_path_factory) -> dict:
    from distci.harness import procs

    out = tmp_path_factory.mktemp("mutations")
    here = Path(__file__).resolve().parent
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")])}
    code = f"import sys, {Path(__file__).stem} as m; m._fork_ranks(2, sys.argv[1])"
    child = procs.start_owned([sys.executable, "-c", code, str(out)], env=env, token=procs.run_token(),
                              death_signal=signal.SIGKILL, cwd=here.parent, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = child.communicate(timeout=1800)
    finally:
        if child.poll() is None:
            procs.kill_tree(child)
    assert child.returncode == 0, log[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return ranks[0] | {f"{k}@rank1": v for k, v in ranks[1].items()}


def _problems(results: dict, name: str, which: str) -> list[str]:
    entry = results[name]
    assert "raised" not in entry, f"{name} raised before its check: {entry['raised']}"
    return entry[which]


def test_controls_pass(mutated):
    for name in [n for n in RUNS if n.startswith("control")]:
        assert _problems(mutated, name, "numerics") == [], name
        assert _problems(mutated, name, "graph") == [], name


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
    from suites.runner.evidence import Evidence

    ops = Counter({"_c10d_functional::all_gather_into_tensor": 8, "aten::mm": 24,
                   "_c10d_functional::reduce_scatter_tensor": 8})
    if fused:
        ops = Counter({"symm_mem::fused_all_gather_matmul": 8, "symm_mem::fused_matmul_reduce_scatter": 8,
                       "aten::mm": 8})
    shards = {"layers.0.attention.wq.weight": "S0", "layers.0.feed_forward.w2.weight": "S1"}
    return Evidence(compiled=True, graphs_after_first_step=2, graphs_total=2, post_grad_graphs=4,
                    post_grad_ops=ops, placements=shards)


def test_async_tp_without_fusion_fails_graph():
    from suites.judges.checks import check_graph, expected_graph
    from suites.scenario.table import SCENARIOS

    expect = expected_graph(SCENARIOS["tp_sp-compile_block-asynctp"])
    assert check_graph(expect, _async_tp_evidence(fused=True)) == []
    problems = check_graph(expect, _async_tp_evidence(fused=False))
    assert any("did not fuse the all-gather side" in p for p in problems), problems
    assert any("did not fuse the reduce-scatter side" in p for p in problems), problems


def test_fsdp_block_that_never_reshards_fails_graph(mutated):
    problems = _problems(mutated, "fsdp_no_reshard", "graph")
    assert any("FSDP all-gathers" in p for p in problems), problems


def test_frozen_weight_that_trains_fails(mutated):
    graph = _problems(mutated, "unfrozen", "graph")
    assert any("frozen parameters require grad: ['tok_embeddings.weight']" in p for p in graph), graph
    assert any("frozen parameters got a gradient: ['tok_embeddings.weight']" in p for p in graph), graph
    numerics = _problems(mutated, "unfrozen", "numerics")
    assert any("tok_embeddings.weight: has a gradient the reference does not" in p for p in numerics), numerics


def test_dropped_expert_fails_numerics(mutated):
    problems = _problems(mutated, "dropped_expert", "numerics")
    assert any("layers.0.feed_forward.experts.1.w2.weight" in p for p in problems), problems


def test_checkpoint_that_loads_nothing_fails_numerics(mutated):
    problems = _problems(mutated, "dcp_no_load", "numerics")
    assert any(p.startswith("step 2: loss") for p in problems), problems
    assert not any(p.startswith(("step 0", "step 1")) for p in problems), problems


def test_varlen_without_dynamic_shapes_breaks_the_recompile_budget(mutated):
    problems = _problems(mutated, "varlen_static", "graph")
    assert any("recompiles after the first step" in p for p in problems), problems


def test_step_that_ran_eager_fails_graph():
    from suites.judges.checks import check_graph, expected_graph
    from suites.scenario.table import SCENARIOS

    expect = expected_graph(SCENARIOS["fsdp-compile_model_aot_eager"])
    assert expect.min_calls_per_step == 1
    fine = check_graph(expect, _evidence(graph_calls=[3, 3, 3]))
    assert not any("fell back to eager" in p for p in fine), fine
    problems = check_graph(expect, _evidence(graph_calls=[3, 0, 3]))
    assert any("step 1 ran 0 compiled graphs" in p and "fell back to eager" in p for p in problems), problems


def test_an_uneven_row_that_ran_even_shards_fails_graph():
    from suites.judges.checks import check_graph, expected_graph
    from suites.scenario.table import SCENARIOS

    expect = expected_graph(SCENARIOS["fsdp-eager-uneven"])
    assert expect.uneven == "fsdp"
    fine = check_graph(expect, _evidence(uneven={"fsdp": ["tok_embeddings.weight"]}))
    assert not any("unevenly" in p or "shard shapes" in p for p in fine), fine
    problems = check_graph(expect, _evidence(uneven={"fsdp": []}))
    assert "no parameter is sharded unevenly under fsdp: the uneven row ran even shards" in problems, problems
    assert "the shard shapes of the fsdp layout were not recorded" in check_graph(expect, _evidence())


def _evidence(**fields):
    from suites.runner.evidence import Evidence

    base = dict(compiled=True, graphs_after_first_step=2, graphs_total=2, graph_calls=[2, 2, 2])
    return Evidence(**{**base, **fields})


def test_fsdp_float8_all_gather_in_high_precision_fails_graph():
    from suites.judges.checks import check_graph, expected_graph
    from suites.scenario.table import SCENARIOS

    expect = expected_graph(SCENARIOS["fsdp-compile_block-f8_tensorwise"])
    assert expect.float8_all_gather_weights == expect.float8_linears > 0
    ok = check_graph(expect, _evidence(float8_linears=expect.float8_linears,
                                       float8_all_gather_weights=expect.float8_linears))
    assert not any("all-gather in float8" in p for p in ok), ok
    problems = check_graph(expect, _evidence(float8_linears=expect.float8_linears, float8_all_gather_weights=0))
    assert any("0 FSDP weights all-gather in float8" in p for p in problems), problems


def test_fsdp_missing_reduce_scatter_and_unsharded_param_fail_graph():
    from suites.judges.checks import FSDP_ALL_GATHER, FSDP_REDUCE_SCATTER, check_graph, expected_graph
    from suites.scenario.table import SCENARIOS

    expect = expected_graph(SCENARIOS["fsdp-compile_block"])
    ops = Counter({f"{FSDP_ALL_GATHER} (layers.0)": expect.fsdp_all_gathers,
                   f"{FSDP_REDUCE_SCATTER} (layers.0)": expect.fsdp_reduce_scatters})
    assert check_graph(expect, _evidence(runtime_ops=ops, placements={"norm.weight": "S0"})) == []
    ops[f"{FSDP_REDUCE_SCATTER} (layers.0)"] -= 1
    problems = check_graph(expect, _evidence(runtime_ops=ops, placements={"norm.weight": "local"}))
    assert any("FSDP reduce-scatters" in p for p in problems), problems
    assert any("norm.weight is local, FSDP2 shards every parameter S0" in p for p in problems), problems


def test_eval_that_ran_eager_or_recompiled_fails_graph():
    from suites.judges.checks import check_graph, expected_graph
    from suites.scenario.table import SCENARIOS

    expect = expected_graph(SCENARIOS["tp-compile_model-eval_no_grad"])
    shards = {"layers.0.attention.wq.weight": "S0"}
    assert check_graph(expect, _evidence(eval_graphs=1, eval_calls=1, placements=shards,
                                         graphs_after_first_step=1, graphs_total=1, graph_calls=[1, 1, 1])) == []
    problems = check_graph(expect, _evidence(eval_graphs=3, eval_calls=0, placements=shards,
                                             graphs_after_first_step=1, graphs_total=1, graph_calls=[1, 1, 1]))
    assert any("the eval forward ran no compiled graph" in p for p in problems), problems
    assert any("the eval forward compiled 3 new graphs" in p for p in problems), problems


def test_eval_numbers_and_routing_are_judged():
    import torch

    from suites.judges.checks import check_numerics, check_routing
    from suites.judges.tolerances import tolerance
    from suites.runner.evidence import TrainRecord

    logits = torch.randn(2, 8, 16)
    ref = TrainRecord(eval_loss=1.0, eval_logits=logits)
    assert check_numerics(ref, TrainRecord(eval_loss=1.0, eval_logits=logits.clone()), tolerance("float32", "none")) == []
    bad = check_numerics(ref, TrainRecord(eval_loss=1.5, eval_logits=logits * 0), tolerance("float32", "none"))
    assert any(p.startswith("eval: loss") for p in bad) and any("eval: logits SQNR" in p for p in bad), bad
    assert check_numerics(ref, TrainRecord(), tolerance("float32", "none")) == ["the eval step did not run"]
    assert check_routing(TrainRecord(expert_tokens=[[5, 3, 0, 1], [4, 4, 1, 0]])) == []
    busy = check_routing(TrainRecord(expert_tokens=[[5, 3, 2, 1], [4, 4, 1, 2]]))
    assert any("empty-expert path was not exercised" in p for p in busy), busy
    starved = check_routing(TrainRecord(expert_tokens=[[5, 3, 1, 0], [4, 4, 1, 0]]))
    assert any("experts [3] never got a token" in p for p in starved), starved


def test_rerouted_steps_are_judged_by_loss_within_a_budget():
    """A token moved by rounding skips that step's gradients; a broken router fails."""
    import torch

    from suites.judges.checks import check_numerics, compare_routing
    from suites.judges.tolerances import tolerance
    from suites.runner.evidence import TrainRecord

    tol = tolerance("float32", "none")
    same = {(s, 0, c): (60, 50, 18, 0) for s in range(3) for c in range(2)}
    one_moved = dict(same) | {(1, 0, 1): (59, 51, 18, 0)}
    grad = {"w": torch.ones(4)}
    ref = TrainRecord(losses=[1.0] * 3, grads=[grad] * 3, routing=same)
    # step 1's gradient is wildly off, but step 1 routed one token elsewhere: loss only
    run = TrainRecord(losses=[1.0] * 3, grads=[grad, {"w": -torch.ones(4)}, grad], routing=one_moved)
    assert compare_routing(ref, run, tol) == ({1: "block 0: 1 of 256 token-expert assignments differ from the reference's"},
                                              [])
    assert check_numerics(ref, run, tol) == []
    # the same gradient error where routing agrees is a failure
    agreed = TrainRecord(losses=[1.0] * 3, grads=[grad, {"w": -torch.ones(4)}, grad], routing=same)
    assert any(p.startswith("step 1: w: gradient SQNR") for p in check_numerics(ref, agreed, tol))
    # a router that sends many tokens elsewhere (e.g. unsynchronized router weights)
    broken = dict(same) | {(0, 0, 0): (30, 80, 18, 0)}
    _, problems = compare_routing(ref, TrainRecord(routing=broken))
    assert problems == ["step 0: routing: block 0: 30 of 256 token-expert assignments differ from the "
                        "reference's (more than 2 beyond the near-ties)"], problems
    # rounding moves a token now and then, not in every step
    drifting = dict(same) | {(s, 0, 0): (59, 51, 18, 0) for s in range(3)}
    _, problems = compare_routing(ref, TrainRecord(routing=drifting))
    assert any("routing differs from the reference beyond its near-ties in 3 steps" in p for p in problems), problems


def test_near_tie_tokens_may_move_in_every_step_and_nothing_more():
    """bf16 rounding flips a token whose top-k logits nearly tie in most steps: such moves
    are free, every other move is judged as before (and the margin is the tolerance's)."""
    from suites.judges.checks import compare_routing
    from suites.runner.routing import top_k_margins
    from suites.judges.tolerances import tolerance
    from suites.runner.evidence import TrainRecord
    import torch

    bf16 = tolerance("bfloat16", "none")
    same = {(s, 0, c): (60, 50, 18, 0) for s in range(3) for c in range(2)}
    drifting = dict(same) | {(s, 0, 0): (59, 51, 18, 0) for s in range(3)}
    tied = {(s, 0, 0): (0.001,) for s in range(3)}
    ref = TrainRecord(routing=same, route_margins=tied)
    rerouted, problems = compare_routing(ref, TrainRecord(routing=drifting), bf16)
    assert problems == [] and sorted(rerouted) == [0, 1, 2]
    assert "(1 near-tie tokens)" in rerouted[0]
    # the same margins under the float32 bound are no ties
    _, problems = compare_routing(ref, TrainRecord(routing=drifting), tolerance("float32", "none"))
    assert any("beyond its near-ties in 3 steps" in p for p in problems), problems
    # a tie recorded in the run counts as well as one in the reference
    _, problems = compare_routing(TrainRecord(routing=same), TrainRecord(routing=drifting, route_margins=tied), bf16)
    assert problems == []
    # near-ties excuse only as many moves as there are ties
    broken = dict(same) | {(0, 0, 0): (30, 80, 18, 0)}
    _, problems = compare_routing(ref, TrainRecord(routing=broken), bf16)
    assert problems == ["step 0: routing: block 0: 30 of 256 token-expert assignments differ from the "
                        "reference's (1 near-tie tokens) (more than 2 beyond the near-ties)"], problems
    # margins: the k-th logit's lead over the best one left out, relative to the largest |logit|
    logits = torch.tensor([[4.0, 3.99, 1.0, -2.0], [4.0, 1.0, 0.5, float("-inf")], [1.0, 0.0, float("-inf"),
                                                                                    float("-inf")]])
    margins = top_k_margins(logits, 1).tolist()
    assert abs(margins[0] - 0.0025) < 1e-6 and abs(margins[1] - 0.75) < 1e-6 and abs(margins[2] - 1.0) < 1e-6
    assert top_k_margins(logits, 2).tolist()[2] == float("inf")
    # a run that recorded no routing where the reference did (a block skipped)
    partial = {k: v for k, v in same.items() if k[2] == 0}
    _, problems = compare_routing(ref, TrainRecord(routing=partial))
    assert any("recorded no routing" in p for p in problems), problems


def test_misrouted_tokens_fail_the_routing_comparison(mutated):
    for name in ("misrouted", "misrouted@rank1"):
        problems = _problems(mutated, name, "numerics")
        assert any(p.startswith("step 0: routing: block 0:") and "token-expert assignments differ" in p
                   for p in problems), problems


def test_gradient_reduction_in_bf16_fails_the_collective_dtype_check(mutated):
    """A MixedPrecisionPolicy whose reduce-scatters run in bf16 where it says float32:
    one more bf16 rounding, inside the bf16 tolerance; only the recorded dtypes see it."""
    problems = _problems(mutated, "reduce_in_bf16", "graph")
    assert any(p.startswith("FSDP gradient reductions ran in {'bfloat16'") and "says float32" in p
               for p in problems), problems
    assert not any("parameter all-gathers" in p for p in problems), problems


def test_clipping_by_a_local_norm_fails_numerics(mutated):
    problems = _problems(mutated, "clip_local_norm", "numerics")
    assert any(p.startswith("step 0: total gradient norm") for p in problems), problems
    assert any("gradient SQNR" in p or "gradient max |diff|" in p for p in problems), problems


def test_a_parameter_that_stops_requiring_grad_fails_graph(mutated):
    problems = _problems(mutated, "lost_requires_grad", "graph")
    assert "parameters that train do not require grad: ['norm.weight'] (after parallelize)" in problems, problems
    assert "parameters that train do not require grad: ['norm.weight'] (after the last step)" in problems, problems


def test_an_untied_output_projection_fails_the_tie_check(mutated):
    problems = _problems(mutated, "untied", "graph")
    for when in ("after parallelize", "after the last step"):
        assert (f"output.weight and tok_embeddings.weight are two parameters {when}: the tied weight was untied"
                in problems), problems


def test_a_routing_edge_that_did_not_happen_fails():
    from suites.runner.routing import edge_problems
    from suites.runner.evidence import TrainRecord

    starved = TrainRecord(routing={(0, 0, 0): (6, 0, 2, 0), (0, 0, 1): (4, 2, 1, 1)})
    assert edge_problems(starved, "empty_first", 2) == []
    problems = edge_problems(starved, "empty_last", 2)
    assert problems == ["routing edge empty_last: expert 1 got 2 tokens in step 0 block 0 microbatch 1, "
                        "where it must get none"], problems
    assert edge_problems(starved, "one_expert", 2)  # expert 0 did not get every token


def test_pipeline_that_sums_its_microbatches_fails_numerics(mutated):
    """A schedule that adds the microbatches' gradients (no scale_grads): every stage's
    gradients are twice the reference's; the first step's loss is unchanged (the later
    ones move with the doubled updates)."""
    problems = _problems(mutated, "pp_summed", "numerics")
    assert not any(p.startswith("step 0: loss") for p in problems), problems
    assert any(re.match(r"step 0: tok_embeddings[.]weight: gradient SQNR -?0[.]0 dB", p) for p in problems), problems
    for stage_param in ("tok_embeddings.weight", "layers.3.feed_forward.w2.weight", "output.weight"):
        assert any(p.startswith("step 0: " + stage_param) for p in problems), (stage_param, problems)



def test_an_export_of_local_shards_fails_numerics(mutated):
    """The full state dict a run exports must be the whole trained model: one made of each
    rank's FSDP2 shards, as if they were whole, names every sharded weight's shape."""
    problems = _problems(mutated, "export_local", "numerics")
    assert any(p.startswith("export: ") and "has shape" in p and "trained" in p for p in problems), problems
    assert all(p.startswith("export: ") for p in problems), problems
    assert not [p for p in _problems(mutated, "control_fsdp", "numerics") if p.startswith("export")]


def test_experts_divided_by_their_own_mesh_fail_numerics(mutated):
    """EP laid out as torchtitan does: an expert's gradient sums its ep group's tokens, so
    FSDP2's default divide factor (the efsdp size) leaves it too large; only experts differ."""
    problems = _problems(mutated, "ep_default_divide", "numerics")
    assert any(".experts." in p for p in problems), problems
    assert not any("attention" in p and "step 0" in p for p in problems), problems


def test_ddp_accumulation_that_syncs_every_microbatch_fails_graph(mutated):
    """DDP / replicate grad_sync=last accumulation without no_sync: the same averaged
    gradients (numbers cannot see it), every bucket all-reduced in each microbatch; only
    the count does."""
    for name in ("ddp_sync_every_microbatch", "replicate_sync_every_microbatch"):
        assert _problems(mutated, name, "numerics") == [], name
        problems = _problems(mutated, name, "graph")
        assert any(re.match(r"the last step ran (\d+) gradient all-reduces for DDP's (\d+) buckets, expected", p)
                   for p in problems), (name, problems)


def test_ddp_gradients_all_reduced_in_bf16_fail_the_dtype_check(mutated):
    """A bf16 compression hook where the row says none: one bf16 rounding (~50 dB), which
    the float32 numbers may or may not see; the recorded dtype always does."""
    problems = _problems(mutated, "ddp_reduce_in_bf16", "graph")
    assert "DDP gradient all-reduces ran in {'bfloat16': 2}, expected float32" in problems, problems


def test_compiled_ddp_without_ddp_optimizer_fails_the_graph_count(mutated):
    """optimize_ddp off: one graph, no split at DDP's buckets (compute and all-reduce no
    longer overlap); the numbers are right, the graph count is not."""
    assert _problems(mutated, "ddp_without_ddp_optimizer", "numerics") == []
    problems = _problems(mutated, "ddp_without_ddp_optimizer", "graph")
    assert "1 graphs compiled in the first step, expected 2..2" in problems, problems


def test_a_cancelling_bias_gradient_is_judged_against_its_weights_scale():
    """A bias gradient that nearly cancels (a router's sums to zero over the experts) has
    rounding noise above its own norm; against its weight's gradient per input it passes,
    and a dropped or doubled bias gradient still fails."""
    import torch

    from suites.judges.checks import bias_floors, check_numerics
    from suites.judges.tolerances import tolerance
    from suites.runner.evidence import TrainRecord

    torch.manual_seed(0)
    tol = tolerance("bfloat16", "none")
    weight = torch.randn(4, 64) * 1e-3
    bias = torch.tensor([1.0, -1.0, 0.5, -0.5]) * 2.1e-4  # cancelled to 1/6 of weight.norm()/8, as measured
    noise = torch.tensor([1.0, 1.0, -1.0, -1.0]) * 2e-5
    ref = TrainRecord(losses=[1.0], grads=[{"router.weight": weight, "router.bias": bias}])
    assert abs(bias_floors(ref.grads[0])["router.bias"] - float(weight.norm()) / 8) < 1e-9

    def problems(run_bias):
        run = TrainRecord(losses=[1.0], grads=[{"router.weight": weight, "router.bias": run_bias}])
        return check_numerics(ref, run, tol)

    assert problems(bias + noise) == []
    # against the bias's own norm this noise is 18 dB (< 20)
    own = TrainRecord(losses=[1.0], grads=[{"router.bias": bias}])
    assert any("router.bias: gradient SQNR" in p for p in check_numerics(own, TrainRecord(losses=[1.0], grads=[
        {"router.bias": bias + noise}]), tol))
    for wrong in (torch.zeros(4), 2 * bias + 1e-3 * torch.ones(4), -bias * 30):
        assert any(p.startswith("step 0: router.bias: gradient SQNR") for p in problems(wrong)), wrong


def test_an_optimizer_that_falls_back_to_the_loop_fails_graph(mutated):
    """foreach=True / fused=True that step with the per-parameter loop train to the same
    numbers; the kernels the last optimizer step ran must say so."""
    for name, kernel in (("fused_as_loop", "aten::_fused_adamw_"), ("foreach_as_loop", "aten::_foreach_")):
        assert _problems(mutated, name, "numerics") == [], name
        problems = _problems(mutated, name, "graph")
        assert any("optimizer did not run" in p and kernel in p for p in problems), (name, problems)


def test_clipping_by_a_local_inf_norm_fails_numerics(mutated):
    """Each rank's largest local |gradient|, never max-reduced: the rank without the global
    maximum scales its shards by another factor, so the gathered gradients differ."""
    for name in ("clip_inf_local_norm", "clip_inf_local_norm@rank1"):
        problems = _problems(mutated, name, "numerics")
        assert any("gradient SQNR" in p or "gradient max |diff|" in p for p in problems), (name, problems)
    norms = _problems(mutated, "clip_inf_local_norm", "numerics") + _problems(mutated, "clip_inf_local_norm@rank1",
                                                                              "numerics")
    assert any(p.startswith("step 0: total gradient norm") for p in norms), norms


def test_grad_sync_last_that_reduces_every_microbatch_fails_graph(mutated):
    """grad_sync=last whose FSDP2 still reduce-scatters every microbatch: the same numbers,
    twice the reductions."""
    assert _problems(mutated, "sync_every_microbatch", "numerics") == []
    problems = _problems(mutated, "sync_every_microbatch", "graph")
    assert any(p.startswith("the last step issued 6 gradient reduce-scatters, expected 3") for p in problems), problems
    assert any("FSDP reduce-scatters, expected 3" in p for p in problems), problems


def test_explicit_prefetch_that_was_not_set_fails_graph(mutated):
    """prefetch=explicit whose blocks kept FSDP2's implicit order: the same numbers and the
    same all-gathers, but block 1's is issued in its own pre-forward, not in block 0's."""
    assert _problems(mutated, "prefetch_ignored", "numerics") == []
    problems = _problems(mutated, "prefetch_ignored", "graph")
    assert any(p.startswith("FSDP2 all-gathers issued before each block's forward (2, 3), expected (3, 3)")
               for p in problems), problems


def test_meta_load_that_leaves_buffers_empty_fails_numerics(mutated):
    problems = _problems(mutated, "meta_load_buffers_left_empty", "numerics")
    assert any(p.startswith("step 0: loss") for p in problems), problems


def test_fp16_step_taken_despite_overflow_fails(mutated):
    problems = _problems(mutated, "fp16_scaler_disabled", "numerics")
    assert any("loss scale after each step" in p for p in problems), problems

