"""torchtitan 0.3.0: tensor parallel silently unties a tied embedding and output projection
(found by distci's `tie` column; no upstream issue found, draft in
reports/upstream-draft-torchtitan-tp-weight-tying.md).

A llama3 built with `enable_weight_tying=True` holds ONE parameter in `tok_embeddings`
and `lm_head` (checked here before parallelizing: the test's own precondition). torchtitan
0.3's `Module.parallelize` distributes each module's states on its own
(`_distribute_states`: `register_parameter(name, nn.Parameter(distribute_tensor(...)))`);
its "already a DTensor: distributed by a sibling (e.g. weight tying)" branch cannot fire,
because registering a new Parameter on the first module leaves the second module's plain
Parameter in place, which is then distributed into a second DTensor Parameter. After
`parallelize_llama` at TP=2 the two modules hold two parameters (CPU, gloo, torch 2.13.0,
2026-12-04): they get separate gradients and separate optimizer updates, so the model
trains untied while its config says tied (and a checkpoint saves two diverging weights).
distci's own TP layout re-ties after the plan (suites/runner/tying.py), as torchtitan's pre-0.3
qwen3 did after parallelizing.
"""

from __future__ import annotations

import importlib.util

import pytest

from ..conftest import tier_marks

pytestmark = [
    *tier_marks("nightly"),
    pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                       reason="torchtitan is not installed in this cell"),
]


@pytest.mark.world_size(2)
@pytest.mark.dist_timeout(300)
def test_tp_keeps_the_tied_embedding_and_output_one_parameter(dist) -> None:
    from ..titan import Job, select_or_skip

    line = select_or_skip()
    job = Job(n_layers=1, seq_len=16, tp=dist.world_size, tie=True)
    model = line.build_model(job, dist.device, seed=0)
    assert model.tok_embeddings.weight is model.lm_head.weight, "the built model is not tied (precondition)"
    model = line.parallelize(model, job, dist.mesh(), dist.world_size, dist.device_type)
    names = [n for n, _ in model.named_parameters() if n.startswith(("tok_embeddings.", "lm_head."))]
    assert model.tok_embeddings.weight is model.lm_head.weight, (
        f"tok_embeddings.weight and lm_head.weight are two parameters after parallelize at TP={dist.world_size}: "
        f"the tie was broken ({names})")
