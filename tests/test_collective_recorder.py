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
