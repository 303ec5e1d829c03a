"""The collective recorder sees functional collectives (DTensor's, TP's) with dtype, group and
size, and never makes a compiled frame run eager; the TP dtype check fails on a wrong dtype.

One gloo process group of one rank in this process (a HashStore): enough for the wrappers,
Dynamo and the profiler, no rank workers needed.
"""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


@pytest.fixture(scope="module")
def one_rank():
    if not dist.is_available():
        pytest.skip("torch.distributed is not built in this torch")
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    if started:
        dist.destroy_process_group()


def test_functional_collectives_are_recorded_with_dtype_group_and_size(one_rank):
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    from suites.runner.collectives import CollectiveCall, functional_dtypes, record_collectives

    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    seen: Counter = Counter()
    calls: list[CollectiveCall] = []
    with record_collectives(seen, calls):
        funcol.wait_tensor(funcol.all_reduce(torch.ones(6, dtype=torch.float64), "sum", (mesh, 0)))
        funcol.wait_tensor(funcol.reduce_scatter_tensor(torch.ones(3, 2, dtype=torch.bfloat16), "sum", 0, mesh))
    assert seen == Counter({("funcol.all_reduce", "float64"): 1, ("funcol.reduce_scatter_tensor", "bfloat16"): 1})
    assert calls == [CollectiveCall("funcol.all_reduce", "float64", "tp", 6),
                     CollectiveCall("funcol.reduce_scatter_tensor", "bfloat16", "tp", 6)]
    assert functional_dtypes(seen) == Counter({"float64": 1, "bfloat16": 1})
    assert funcol.all_reduce.__module__ == "torch.distributed._functional_collectives", "the original is back"


def test_recording_around_a_compiled_function_keeps_it_compiled(one_rank):
    import torch.distributed._functional_collectives as funcol

    from suites.runner.collectives import record_collectives
    from suites.runner.evidence import count_executed_ops
    from suites.runner.parallelize import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter("eager")

    def step(x):
        return funcol.wait_tensor(funcol.all_reduce(x * 2, "sum", [0])) + 1

    compiled = torch.compile(step, backend=counter, fullgraph=True)
    seen: Counter = Counter()
    ops: Counter = Counter()
    with record_collectives(seen), count_executed_ops(ops):
        out = compiled(torch.ones(5))
        compiled(torch.ones(5))
    assert torch.equal(out, torch.full((5,), 3.0))
    assert counter.graphs == 1 and counter.calls == 2, "the frame compiled once and ran compiled"
    assert not seen, "inside a trace the wrapper records nothing (no side effect baked into the graph)"
    assert any("all_reduce" in name and "c10d_functional" in name for name in ops), sorted(ops)[:20]
    torch._dynamo.reset()


def test_executed_ops_are_counted_as_the_profilers_event_list_counts_them(one_rank):
    """count_executed_ops counts the profiler's raw events (evidence._event_names), not the
    FunctionEvents `prof.events()` builds: the counts must be that list's, with its rule that
    an event alone under a parent of the same name is folded into it, on what the checks count
    (FSDP2's labelled reduce-scatters, optimizer kernels, DTensor ops; a mesh of one rank
    gathers nothing)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.profiler import ProfilerActivity, profile

    from suites.runner.evidence import _event_names

    mesh = init_device_mesh("cpu", (1,))
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    weight = distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)])

    def step() -> None:
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        (weight @ weight).sum()

    step()  # the lazy first-step work (lazy init, imports) stays out of the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    counted = _event_names(prof)
    assert counted == Counter(event.name for event in prof.events())
    assert any(name.startswith("FSDP::post_backward_reduce") for name in counted), sorted(counted)[:40]
    kept = sum(1 for e in prof.profiler.kineto_results.events() if e.name() in counted)
    assert sum(counted.values()) < kept, "no event was folded into a same-named parent: the rule went untested"


def test_tp_collectives_in_the_wrong_dtype_fail_the_check():
    from suites.judges.graph_checks import GraphExpectation, _tp_collective_problems

    exp = GraphExpectation(tp_collective_dtypes=("bfloat16", "float32"), tp_collectives_seen=True)
    good = Counter({("funcol.all_reduce", "bfloat16"): 4, ("funcol.all_gather_tensor", "float32"): 1})
    assert _tp_collective_problems(exp, good) == []
    wrong = Counter({("funcol.all_reduce", "float16"): 2, ("all_gather_into_tensor", "float16"): 9})
    assert _tp_collective_problems(exp, wrong) == [
        "TP functional collectives ran in {'float16': 2}, expected only bfloat16, float32"]
    assert _tp_collective_problems(exp, Counter()) == [
        "no TP functional collective was recorded in the last step (DTensor's redistributes went unseen)"]


def test_the_expectation_asks_eager_tp_rows_for_their_collectives():
    from suites.judges.graph_checks import expected_graph
    from suites.scenario.record import row

    assert expected_graph(row("tp_sp"), "float32").tp_collective_dtypes == ("float32",)
    assert expected_graph(row("tp_sp"), "float32").tp_collectives_seen
    assert not expected_graph(row("tp", "model", "eager"), "float32").tp_collectives_seen
    assert expected_graph(row("fsdp"), "float32").tp_collective_dtypes == ()
