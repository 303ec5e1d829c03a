"""The models generator: its space, draws and shrinking (quick, no ranks), localization (quick,
one process), and its planted bugs found and shrunk end to end on 2 gloo ranks (slow).

Each slow test runs `python -m distci fuzz --generator models` for real (this interpreter's
stack) with one plant of suites/generators/model_plants.py set, every feature held by
`--space` except the plant's own and a few distractors, so the draws fail with features to
shrink away; the shrunk structure must keep what the plant needs and nothing else, and its
signature must name the module localization found.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from distci.fuzz.models import Drawer, ModelFuzzer, parse_space, smaller
from distci.fuzz.records import Outcome
from distci.stack import Stack
from suites.generators.model_space import FEATURES, key, non_default, parse, problems, valid

REPO = Path(__file__).resolve().parents[1]
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"
BATCHES = {"seq": "fixed", "pad": False, "loss": "mean", "compile": "none", "backend": "aot_eager"}
"""The batch features and compile at their defaults: later than every feature these tests were
written for."""


def test_every_drawn_structure_is_valid_and_its_key_reads_back():
    drawer = Drawer("space")
    drawn = [drawer.draw() for _ in range(60)]
    assert len({key(s) for s in drawn}) == 60
    for s in drawn:
        assert valid(s) and parse(key(s)) == s
    assert {s["parallel"] for s in drawn} == {"fsdp", "tp", "ddp", "replicate", "hsdp", "fsdp_tp", "pp", "pp_fsdp",
                                                 "pp_tp"}
    assert any(s["experts"] and s["tie"] for s in drawn)
    assert {s["plan"] for s in drawn} == {"megatron", "titan", "hf"} and any(s["loss_parallel"] for s in drawn)


def test_later_features_leave_a_seeds_first_draws_as_they_were():
    """The plans, attention and fsdp_tp come from a stream of their own: with them held at
    their origin, a seed draws exactly the structures it drew before they existed."""
    later = [f for f in FEATURES if f.later]
    first_only = {f.name: f.first for f in later}
    for seed in ("a", "night", "2026-12-07"):
        widened, plain = Drawer(seed), Drawer(seed, first_only)
        for _ in range(40):
            s, old = widened.draw(), plain.draw()
            assert {**s, **{f.name: f.origin_of(s[f.name]) for f in later if s[f.name] in f.later}} == old
    assert key(Drawer("a", first_only).draw()) == "tp", "seed a's first draw since before the plans"


def test_a_seed_replays_and_space_restricts():
    assert [key(Drawer("a").draw()) for _ in range(5)] == [key(Drawer("a").draw()) for _ in range(5)]
    drawer = Drawer("b", parse_space(["parallel=ddp,tp", "experts=4"]))
    for _ in range(10):
        s = drawer.draw()
        assert s["parallel"] in ("ddp", "tp") and s["experts"] == 4
    with pytest.raises(ValueError, match="experts"):
        parse_space(["experts=3"])


def test_rules_say_only_what_is_meaningless():
    assert problems({"parallel": "ddp", "top_k": 2}) == ["top_k picks among the routed experts: top_k <= experts"]
    assert problems({"parallel": "tp", "wrap": "nested"}) == ["wrap places FSDP2's units: parallel=fsdp, hsdp, fsdp_tp or pp_fsdp"]
    assert valid({"parallel": "hsdp", "wrap": "nested"}) and valid({"parallel": "fsdp_tp", "wrap": "grouped"})
    assert problems({"parallel": "fsdp", "plan": "titan"}) == ["plan is a TP plan: parallel=tp, fsdp_tp or pp_tp"]
    assert problems({"parallel": "tp", "plan": "hf", "loss_parallel": True}) == [
        "loss_parallel reads the head's Shard(-1) logits, which plan=titan makes"]
    assert valid({"parallel": "fsdp_tp", "plan": "titan", "loss_parallel": True, "experts": 2, "mtp": True})
    assert not valid({"parallel": "tp", "plan": "titan", "buffer": "rope"})
    assert not valid({"parallel": "tp", "plan": "hf", "tie": True}) and valid({"parallel": "tp", "plan": "titan", "tie": True})
    assert valid({"parallel": "tp", "plan": "titan", "buffer": "rope", "attn": True})
    assert valid({"parallel": "tp", "experts": 4, "top_k": 2, "uneven": True, "param": "spectral_norm"})
    assert problems({"parallel": "ddp", "balance": True}) == ["the balancing bias steers routed experts: experts > 0"]
    assert valid({"parallel": "tp", "frozen": "lora", "ac": "selective", "experts": 2, "balance": True})
    with pytest.raises(ValueError, match="'moe3' is no model feature"):
        parse("fsdp-moe3")


def test_smaller_moves_one_feature_toward_its_default():
    s = parse("ddp-blocks3-moe4-top2-tied-steps3")
    out = smaller(s)
    assert all(valid(c) and c["parallel"] == "ddp" for c in out)
    assert parse("ddp-blocks3-tied-steps3") in out, "experts 0 takes top_k with it"
    assert parse("ddp-moe4-top2-tied-steps3") in out and parse("ddp-blocks2-moe4-top2-tied-steps3") in out
    assert smaller(parse("fsdp")) == []
    assert parse("ddp-frozen_lora") in smaller(parse("ddp-moe2-frozen_lora-lb_bias")), "experts 0 takes the bias"


def _fake(bug, near=None):
    """A batch runner whose 'bug' fails exactly the structures `bug` accepts."""
    def run(structures):
        return [Outcome(s, "failed", "AssertionError: the bug", 1.0, near_miss=near) if bug(s) else
                Outcome(s, "passed", seconds=1.0) for s in structures]
    return run


def test_a_find_shrinks_to_the_features_it_needs():
    bug = _fake(lambda s: s["tie"] and s["steps"] >= 2)
    report = ModelFuzzer("shrink3", bug, budget_s=1e9, max_structures=80, log=lambda m: None).run()
    assert len(report.finds) == 1 and report.finds[0].complete
    needs = non_default(report.finds[0].shrunk.case)
    needs.pop("parallel", None)
    assert needs == {"tie": True, "steps": 2}
    assert report.new == report.finds


def test_a_near_miss_is_never_new_and_gets_one_shrink_round():
    bug = _fake(lambda s: s["experts"] > 0, near="pytorch158719 (its tests do not name it)")
    report = ModelFuzzer("near", bug, budget_s=1e9, max_structures=30, log=lambda m: None).run()
    assert report.finds and report.new == []
    assert report.near_misses and all(len(f.steps) <= 1 for f in report.finds)


# --- localization ------------------------------------------------------------------------

torch = pytest.importorskip("torch")


def _traced(model, x):
    from suites.judges.localize import Tracer

    tracer = Tracer(model)
    with tracer.tracing():
        model(x).square().sum().backward()
    return tracer.take()


def _pair(break_layer: int | None, noise: float = 0.0):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    run = torch.nn.Sequential(*[m for m in __import__("copy").deepcopy(ref)])
    with torch.no_grad():
        if break_layer is not None:
            run[break_layer].weight[0, 0] += 1e-3
        for p in run.parameters():
            p.mul_(1 + noise)
    return ref, run


@pytest.mark.parametrize("broken", [0, 2, 3])
def test_localization_names_the_first_module_that_leaves_the_reference(broken):
    from suites.judges.localize import Trace, first_divergence

    ref, run = _pair(broken)
    x = torch.randn(5, 8)
    found = first_divergence(Trace({(0, 0): _traced(ref, x)}), {(0, 0): [_traced(run, x)]}, False, 1)
    assert found is not None and (found.kind, found.module) == ("forward output", str(broken))


def test_rounding_level_differences_stay_inside_the_bound():
    from suites.judges.localize import Trace, first_divergence

    ref, run = _pair(None, noise=torch.finfo(torch.float32).eps)
    x = torch.randn(5, 8)
    assert first_divergence(Trace({(0, 0): _traced(ref, x)}), {(0, 0): [_traced(run, x)]}, False, 1) is None


def test_data_parallel_and_tp_shards_are_put_back_together():
    from suites.judges.localize import combine

    full = torch.arange(24.0).view(4, 6)
    assert torch.equal(combine([full[:2], full[2:]], full, True), full)
    assert torch.equal(combine([full[:, :4], full[:, 4:]], full, False), full)  # uneven TP shards
    assert torch.equal(combine([full, full], full, False), full)
    assert combine([full[:1]], full, True) is None


def test_a_gradient_bug_is_localized_to_the_parameter():
    from suites.judges.localize import Trace, first_divergence

    ref, run = _pair(None)
    grads_ref = [{"3.weight": torch.ones(4, 8)}]
    grads_run = [{"3.weight": torch.ones(4, 8) * 2}]
    x = torch.randn(5, 8)
    found = first_divergence(Trace({(0, 0): _traced(ref, x)}), {(0, 0): [_traced(run, x)]}, False, 1,
                             ref_grads=grads_ref, run_grads=grads_run)
    assert (found.kind, found.module) == ("parameter gradient", "3.weight")
    assert found.signature == "the parameter gradient of 3.weight leaves the reference first"


# --- the structures as production code builds them (one process) -------------------------

def _grads(structure: str) -> tuple[float, dict]:
    from suites.generators import model_structures as ms
    from suites.runner.evidence import clean_name

    model = ms.build(parse(structure), torch.device("cpu"))
    tokens, labels = ms.data(parse(structure), model.vocab, 2)[0][0]
    logits = model(tokens)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    return float(loss.detach()), {clean_name(n): p.grad for n, p in model.named_parameters()}


def test_frozen_parameters_are_the_ones_real_recipes_freeze():
    _, lora = _grads("fsdp-moe2-frozen_lora")
    trained = {n for n, g in lora.items() if g is not None}
    assert trained and all(".lora_" in n for n in trained), "torchtune: only the adapters train"
    assert len(trained) < len(lora) and any(n.endswith("w2.lora_b.weight") for n in trained)
    _, tied = _grads("fsdp-tied-frozen_embedding")
    assert tied["tok.weight"] is None and tied["layers.0.ffn.w1.weight"] is not None


@pytest.mark.parametrize("ac", ["full", "selective"])
@pytest.mark.parametrize("structure", ["fsdp-blocks2-moe2-shared_expert", "ddp-blocks2-vit_mha",
                                       "fsdp-blocks2-tied-encdec"])
def test_checkpointing_a_block_changes_no_number(ac, structure):
    loss, grads = _grads(structure)
    loss_ac, grads_ac = _grads(f"{structure}-ac_{ac}")
    assert loss_ac == loss and grads_ac.keys() == grads.keys()
    for name, g in grads.items():
        assert (g is None) == (grads_ac[name] is None), name
        assert g is None or torch.allclose(g, grads_ac[name], rtol=1e-6, atol=1e-7), name


def test_the_balancing_bias_steers_toward_idle_experts_outside_autograd():
    from suites.generators import model_structures as ms

    model = ms.build(parse("ddp-moe4-lb_bias"), torch.device("cpu"))
    moe = model.layers[0].ffn
    tokens, _ = ms.data(parse("ddp-moe4-lb_bias"), model.vocab, 2)[0][0]
    model(tokens).sum().backward()
    counts = moe.tokens_per_expert.clone()
    assert counts.sum() == tokens.numel() and moe.expert_bias.grad is None
    ms.update_expert_bias(model)
    busiest, idlest = int(counts.argmax()), int(counts.argmin())
    assert moe.expert_bias[busiest] < 0 < moe.expert_bias[idlest], (counts, moe.expert_bias)
    assert abs(float(moe.expert_bias.sum())) < 1e-6 and moe.tokens_per_expert.sum() == 0


@pytest.mark.parametrize("structure", ["fsdp-blocks2-compile_blocks", "fsdp-blocks2-moe2-compile_blocks",
                                       "ddp-blocks2-vit-compile_blocks", "fsdp-blocks2-encdec-compile_blocks"])
def test_a_compiled_blocks_output_is_traced_outside_its_graph_and_its_inside_is_not(structure):
    """localize.Tracer hooks the compiled block's wrapper, whose hooks run outside the compiled
    frame (fullgraph=True would refuse a hook inside it), and nothing inside; the compiled run
    gives the eager reference's numbers (aot_eager runs the same ATen ops)."""
    from suites.generators import model_structures as ms
    from suites.generators.model_compile import graphs
    from suites.judges.localize import Tracer

    s = parse(structure)
    ref, run = ms.build(s, torch.device("cpu")), ms.build(s, torch.device("cpu"))
    ms.compile_blocks(run)
    tokens, _ = ms.data(s, ref.vocab, 2)[0][0]
    traces = []
    before = graphs()
    for model in (ref, run):
        tracer = Tracer(model)
        with tracer.tracing():
            model(tokens).float().square().mean().backward()
        traces.append({k: t for k, t in tracer.take()})
    assert graphs() > before, "nothing was compiled"
    eager, compiled = traces
    blocks = {k[1] for k in compiled if "layers." in k[1]}
    assert blocks and all(name.rsplit(".", 1)[-1].isdigit() for name in blocks), blocks
    assert ("output gradient", sorted(blocks)[0], 0) in compiled
    for k, t in compiled.items():
        assert torch.allclose(t, eager[k], rtol=1e-6, atol=1e-7), k
    assert len(eager) > len(compiled)


def test_compile_rules_say_what_is_meaningless():
    assert not valid({"parallel": "fsdp", "backend": "inductor"})
    assert not valid({"parallel": "pp", "compile": "model"})
    assert valid({"parallel": "pp", "compile": "blocks", "backend": "inductor"})
    assert valid({"parallel": "ddp", "compile": "model"})
    assert key(parse("tp-compile_model-inductor")) == "tp-compile_model-inductor"


# --- planted bugs, end to end ----------------------------------------------------------------

def _space(drawn: dict[str, str]) -> list[str]:
    out = []
    for f in FEATURES:
        out += ["--space", f"{f.name}={drawn.get(f.name, str(f.default))}"]
    return out


PLANTS = {
    # plant: (features drawn, what the shrunk structure must need, what the signature names, seed
    # whose first draw carries distractor features: `--list` with the same --space shows it)
    "buffer_drift": ({"parallel": "fsdp", "buffer": "rope", "tie": "true,false", "steps": "1,2"},
                     lambda n: n == {"buffer": "rope"}, "the forward output of layers.N", "drift6"),
    "tied_grad_once": ({"parallel": "fsdp", "tie": "true", "buffer": "none,persistent", "blocks": "1,2"},
                       lambda n: n == {"tie": True}, "gradient of tok.weight", "tie"),
    # routing decides where an expert idles: the shrinker may keep 2 of the 4 experts, or one step
    # with two microbatches; never the tie, never a buffer
    "idle_expert_stale": ({"parallel": "ddp", "experts": "4", "steps": "2", "tie": "true,false",
                           "buffer": "none,persistent"},
                          lambda n: n.get("parallel") == "ddp" and n.get("experts") and not {"tie", "buffer"} & set(n),
                          "of layers.N.ffn.experts.N.w1.weight", "idle1"),
    # requires_grad does not survive: the numbers are right, the frozen weight has a gradient
    "frozen_grad": ({"parallel": "fsdp", "frozen": "embedding", "tie": "true,false", "steps": "1,2"},
                    lambda n: n == {"frozen": "embedding"}, "(present on one side only) of tok.weight", "frozen2"),
    # full AC only: op-level SAC notices an op the forward did not run and raises instead
    "recompute_drift": ({"parallel": "fsdp", "ac": "full", "blocks": "1,2", "buffer": "none,persistent"},
                        lambda n: n == {"ac": "full"}, "the forward output of layers.N.ffn.w1", "recompute"),
    # a step after the first bias update; the tie is a distractor
    # a plan bug: only plan=titan has SequenceParallel norms; attention and the buffer are distractors
    "sp_norm_grad_local": ({"parallel": "tp", "plan": "titan", "attn": "true,false", "steps": "1,2",
                            "buffer": "none,persistent"},
                           lambda n: n == {"parallel": "tp", "plan": "titan"}, "gradient of layers.N.norm.weight", "sp"),
    # a pipeline's tied pair not summed over its stages: the first gradient off is the embedding's
    "pp_tied_unsummed": ({"parallel": "pp", "tie": "true", "buffer": "none,persistent", "blocks": "1,2"},
                         lambda n: n == {"parallel": "pp", "tie": True}, "gradient of tok.weight", "tie"),
    # one schedule's last stage unscaled: it needs that schedule, and the 2 blocks its 4 stages need
    "pp_stage_unscaled": ({"parallel": "pp", "schedule": "interleaved_1f1b", "blocks": "2,3",
                           "buffer": "none,persistent", "steps": "1,2"},
                          lambda n: n == {"parallel": "pp", "schedule": "interleaved_1f1b", "blocks": 2},
                          "parameter gradient of norm.weight", "sched"),
    # PP x TP: the tied copies summed over the world, not the pipeline's group
    "pp_tp_tied_world": ({"parallel": "pp_tp", "tie": "true", "buffer": "none,persistent", "blocks": "1,2"},
                         lambda n: n == {"parallel": "pp_tp", "tie": True}, "gradient of tok.weight", "tie"),
    "balance_local_counts": ({"parallel": "ddp", "experts": "4", "balance": "true", "steps": "2,3",
                              "tie": "true,false"},
                             lambda n: n.get("balance") and n.get("experts") and n.get("steps", 1) >= 2
                             and "tie" not in n, "the forward output of layers.N.ffn", "f2"),
    # the counts summed over the mesh's first axis: only the (1, N) HSDP mesh of mesh=singleton
    # puts a size-1 axis there under fsdp; the tie is a distractor, direct is drawn beside it
    "dp_first_axis": ({"parallel": "fsdp", "experts": "4", "balance": "true", "steps": "2",
                       "mesh": "direct,singleton", "tie": "true,false"},
                      lambda n: n.get("mesh") == "singleton" and n.get("balance") and n.get("experts")
                      and n.get("steps", 1) >= 2 and "tie" not in n, "the forward output of layers.N.ffn", "dp3"),
    # a vision transformer's root-level class token reduced from rank 0's share only: the
    # root unit's own bare parameters; the wrap and the second step are distractors
    "root_param_unreduced": ({"parallel": "fsdp", "family": "vit", "blocks": "1,2", "steps": "1,2",
                              "wrap": "blocks,root"},
                             lambda n: n == {"family": "vit"}, "parameter gradient of cls_token", "vit"),
    # T5's position bias handed on detached: needs a second block to hand it to; the third
    # block, the tie and the second step are distractors
    "shared_bias_first_use": ({"parallel": "fsdp", "family": "encdec", "blocks": "2,3", "steps": "1,2",
                               "tie": "true,false"},
                              lambda n: n == {"family": "encdec", "blocks": 2}, "relative_attention_bias", "b6"),
    # the loss's token count takes pads for valid tokens: needs padding and a global-token loss;
    # the second step and the varied lengths are distractors (model_batches)
    "pad_tokens_counted": ({"parallel": "ddp", "pad": "true", "loss": "items", "seq": "fixed,varied", "steps": "1,2"},
                           lambda n: n == {"parallel": "ddp", "pad": True, "loss": "items"}, "the output gradient of output",
                           "pad1"),
    # a compiler pass that scales every SiLU of a compiled graph: only a compiled structure shows
    # it, localized to the compiled block's output (its inside is not traced); the second block,
    # the tie and the second step are distractors
    "compiled_silu_drift": ({"parallel": "ddp", "compile": "blocks", "backend": "aot_eager", "blocks": "1,2",
                             "steps": "1,2", "tie": "true,false"},
                            lambda n: n == {"parallel": "ddp", "compile": "blocks"},
                            "the forward output of layers.N leaves", "cs1"),
}


def fuzz(tmp: Path, plant: str, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    from distci.harness import procs

    env = {**os.environ, "DISTCI_MODELS_PLANT": plant}
    cmd = [sys.executable, "-m", "distci", "fuzz", "--generator", "models", "--cell", CELL, "--python",
           sys.executable, "--runs-root", str(tmp / "runs"), *args]
    child = procs.start_owned(cmd, env=env, token=procs.run_token(), death_signal=signal.SIGTERM, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=900)
    finally:
        if child.poll() is None:
            procs.stop(child)
    proc = subprocess.CompletedProcess(cmd, child.returncode, out, err)
    reports = sorted((tmp / "runs").glob("*/fuzz/models-report.json"))
    assert reports, f"no report:\n{out[-3000:]}\n{err[-3000:]}"
    return proc, json.loads(reports[-1].read_text())


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_bug_is_found_shrunk_and_localized(tmp_path, plant):
    drawn, needs, names, seed = PLANTS[plant]
    # an empty registry: a plant's signature may be a registered bug's (idle_expert_stale's is
    # pytorch158719's face under FSDP2), which would make the find that entry's near miss
    (tmp_path / "no-known-issues.toml").write_text("")
    proc, report = fuzz(tmp_path, plant, "--seed", seed, "--max-configs", "1", "--batch", "3", "--budget", "15m",
                        "--known-issues", str(tmp_path / "no-known-issues.toml"), *_space(drawn))
    assert proc.returncode == 1, proc.stdout[-3000:]
    find = report["finds"][0]
    assert find["complete"] and find["steps"], f"the draw had distractors to shrink away: {proc.stdout[-3000:]}"
    assert needs(non_default(find["shrunk"]["structure"])), proc.stdout[-3000:]
    assert names in find["shrunk"]["signature"], find["shrunk"]["signature"]
    assert "repro:" in proc.stdout and f"test_model_structure[{find['shrunk']['id']}]" in proc.stdout


def test_uneven_tp_structures_are_the_registered_pytorch150336():
    """The generator's TP structures with hidden 31 hit pytorch#150336 (the table keeps its TP
    hidden width even for it): known, not new, on every stack the entry applies to."""
    from distci.known_issues import load_registry

    registry = load_registry(REPO / "suites" / "known_issues.toml")
    test = "suites/generators/models_entry.py::test_model_structure[tp-blocks2-tied-uneven]"
    sig = "RuntimeError: a and b must have same reduction dim, but got [N, N] X [N, N]."
    assert registry.match(test, sig, "", Stack(torch="2.13.0")) == "pytorch150336-uneven-rowwise-input"
    two_d = "suites/generators/models_entry.py::test_model_structure[fsdp_tp-moe4-uneven-attn-plan_titan]"
    assert registry.match(two_d, sig, "", Stack(torch="2.15.0")) == "pytorch150336-uneven-rowwise-input"


def test_torchtitans_plan_under_lora_is_the_registered_sequence_parallel_unfreeze():
    """LoRA freezes every norm; the titan plan's SequenceParallel unfreezes them (torch 2.13.0
    with fixes off, 2026-12-07): the registered entry, not a new find."""
    from distci.known_issues import load_registry

    registry = load_registry(REPO / "suites" / "known_issues.toml")
    lora = "suites/generators/models_entry.py::test_model_structure[tp-frozen_lora-plan_titan]"
    unfrozen = "AssertionError: the gradient (present on one side only) of layers.N.norm.weight leaves the reference first"
    assert registry.match(lora, unfrozen, "", Stack(torch="2.13.0")) == "distci-sequence-parallel-unfreezes"
    megatron = "suites/generators/models_entry.py::test_model_structure[tp-frozen_lora]"
    assert registry.match(megatron, unfrozen, "", Stack(torch="2.13.0")) is None


# --- the TP plans as their sources write them (one process, a 1-rank mesh) ------------------

PLACED = {
    # parameter -> its placement on the TP mesh (None: a plain tensor, the module left whole)
    "megatron": {"tok.weight": None, "layers.0.norm.weight": None, "layers.0.attention.wq.weight": "S(0)",
                 "layers.0.attention.wo.weight": "S(1)", "layers.0.ffn.experts.0.w1.weight": "S(0)",
                 "layers.0.ffn.experts.0.w2.weight": "S(1)", "layers.0.ffn.router.weight": None,
                 "output.weight": None, "mtp.norm.weight": None},
    "titan": {"tok.weight": "S(0)", "layers.0.norm.weight": "R", "layers.0.attention_norm.weight": "R",
              "layers.0.attention.wq.weight": "S(0)", "layers.0.attention.wo.weight": "S(1)",
              "layers.0.ffn.experts.0.w1.weight": "S(0)", "layers.0.ffn.router.weight": None, "norm.weight": "R",
              "output.weight": "S(0)", "mtp.norm.weight": "R", "mtp.proj.weight": "S(0)"},
    "hf": {"tok.weight": None, "layers.0.norm.weight": None, "layers.0.attention.wv.weight": "S(0)",
           "layers.0.ffn.experts.1.w2.weight": "S(1)", "output.weight": "S(0)", "mtp.proj.weight": None},
}


@pytest.mark.parametrize("plan", list(PLACED))
def test_a_plan_lays_each_module_kind_out_as_its_source_writes_it(tmp_path, plan):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from suites.generators import model_structures as ms
    from suites.runner.evidence import clean_name

    structure = parse("tp-moe2-mtp-attn" + {"megatron": "", "titan": "-plan_titan-loss_parallel",
                                             "hf": "-plan_hf"}[plan])
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = ms.build(structure, torch.device("cpu"))
        ms.parallelize(model, init_device_mesh("cpu", (1,)))
        placed = {clean_name(n): "".join("R" if p.is_replicate() else f"S({p.dim})"
                                         for p in getattr(w, "placements", ())) or None
                  for n, w in model.named_parameters()}
        assert {n: placed[n] for n in PLACED[plan]} == PLACED[plan]
        logits = model(ms.data(structure, model.vocab, 1)[0][0][0])
        assert getattr(logits, "placements", None) == ((Shard(2),) if structure["loss_parallel"] else None)
        if plan != "hf":  # a tied pair stays one parameter (titan re-ties after its plan, as trainers do)
            tied = ms.build({**structure, "tie": True}, torch.device("cpu"))
            ms.parallelize(tied, init_device_mesh("cpu", (1,)))
            assert tied.output.weight is tied.tok.weight
    finally:
        dist.destroy_process_group()


try:
    from torch.distributed.tensor import Shard
except ImportError:  # torch < 2.4
    from torch.distributed._tensor import Shard


# --- the pipeline layout (parallel=pp) -------------------------------------------------------

def test_pipeline_features_need_a_pipeline_and_what_its_api_takes():
    assert problems({"parallel": "ddp", "schedule": "zbv"}) == [
        "schedule, microbatches, split and pp_loss configure a pipeline: parallel=pp, pp_fsdp or pp_tp"]
    assert not valid({"parallel": "pp", "reuse": True})
    assert not valid({"parallel": "pp", "schedule": "1f1b", "microbatches": 1})  # 1F1B's own ValueError
    assert valid({"parallel": "pp", "schedule": "interleaved_1f1b", "microbatches": 1, "blocks": 2})
    assert not valid({"parallel": "pp", "schedule": "zbv", "blocks": 1}), "torchtitan's split: blocks + 2 >= 4 stages"
    assert valid({"parallel": "pp", "schedule": "zbv", "blocks": 1, "split": "last"})
    assert valid({"parallel": "pp", "microbatches": 3, "tie": True, "experts": 4, "frozen": "lora", "ac": "selective"})


def test_pp_fsdp_takes_the_pipelines_rules_and_fsdps_wrap():
    """pp_fsdp is a pipeline (its rules hold) whose stages FSDP2 wraps (wrap is meaningful)."""
    from suites.generators.model_space import RANKS

    assert RANKS["pp_fsdp"] == 4, "a 2x2 (pp, dp_shard) mesh whatever the cell's world size"
    assert not valid({"parallel": "pp_fsdp", "reuse": True})
    assert not valid({"parallel": "pp_fsdp", "schedule": "1f1b", "microbatches": 1})
    assert not valid({"parallel": "pp_fsdp", "schedule": "zbv", "blocks": 1})
    assert not valid({"parallel": "pp_fsdp", "param": "spectral_norm", "microbatches": 2})
    assert valid({"parallel": "pp_fsdp", "wrap": "grouped", "schedule": "zbv", "blocks": 2, "tie": True})
    assert valid({"parallel": "pp_fsdp", "wrap": "nested", "microbatches": 3, "experts": 4, "balance": True})
    assert not valid({"parallel": "pp", "wrap": "root"}), "pp alone places no FSDP2 unit"


def test_pp_fsdp_grows_from_hsdp_draws_and_keeps_their_first_stream():
    """Every pp_fsdp draw is an hsdp draw of the first stream (the same 2x2 mesh, its wrap
    kept) with a pipeline added; `--space parallel=pp_fsdp` draws only pp_fsdp."""
    from suites.generators.model_space import FEATURE, PIPELINE

    assert FEATURE["parallel"].origin_of("pp_fsdp") == "hsdp"
    first_only = {f.name: f.first for f in FEATURES if f.later}
    widened, plain = Drawer("2026-12-07-ppfsdp"), Drawer("2026-12-07-ppfsdp", first_only)
    grown = 0
    for _ in range(80):
        s, old = widened.draw(), plain.draw()
        if s["parallel"] == "pp_fsdp":
            grown += 1
            assert old["parallel"] == "hsdp"
            assert {k: v for k, v in s.items() if k not in PIPELINE and k not in ("attn", "parallel", "mesh", *BATCHES)} == {
                k: v for k, v in old.items() if k not in PIPELINE and k not in ("attn", "parallel", "mesh", *BATCHES)}
    assert grown > 0
    drawer = Drawer("2026-12-07-ppfsdp", parse_space(["parallel=pp_fsdp"]))
    forced = [drawer.draw() for _ in range(30)]
    assert {s["parallel"] for s in forced} == {"pp_fsdp"}
    assert len({s["schedule"] for s in forced}) > 2 and any(s["wrap"] != "blocks" for s in forced)


def test_pp_fsdp_rows_and_reference_loss_are_each_pipelines_mean():
    """pp_fsdp's global batch is both pipelines' rows; the reference loss is the mean over the
    pipelines of each one's schedule loss (mb3: each pipeline's rows 2, 1, 1)."""
    from suites.generators import model_structures as ms
    from suites.generators.model_pipeline import reference_loss

    tokens, _ = ms.data(parse("pp_fsdp"), ms.VOCAB, 4)[0][0]
    assert tokens.shape[0] == ms.PP_ROWS * ms.PP_DP_SHARD
    logits, labels = torch.randn(8, 3, 5), torch.randint(0, 5, (8, 3))
    per = [reference_loss(parse("pp-mb3"), logits[a:a + 4], labels[a:a + 4]) for a in (0, 4)]
    assert torch.allclose(reference_loss(parse("pp_fsdp-mb3"), logits, labels), sum(per) / 2)
    full = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    assert not torch.allclose(sum(per) / 2, full)
    tokens_loss = reference_loss(parse("pp_fsdp-mb3-pp_loss_tokens"), logits, labels)
    assert torch.allclose(tokens_loss, full), "every token valid: both pipelines count 12, the means agree"


def test_pp_fsdp_token_loss_reference_is_the_mean_of_each_pipelines_own_count():
    """torchtitan's token loss under pp_fsdp: each pipeline divides its token sum by its own
    valid tokens and FSDP2 averages the pipelines. With padded rows the counts differ, so the
    reference is the mean of the two token means, not the batch's (which filed
    pp_fsdp-ga2-pp_loss_tokens-padded, pipelines of 10 and 13 valid tokens, as a divergence)."""
    from suites.generators.model_batches import IGNORE_INDEX
    from suites.generators.model_pipeline import reference_loss

    logits, labels = torch.randn(8, 3, 5), torch.randint(0, 5, (8, 3))
    labels[:4, 1:] = IGNORE_INDEX  # the first pipeline keeps 4 valid tokens, the second 12
    ce = torch.nn.functional.cross_entropy
    mine = [ce(logits[a:a + 4].flatten(0, 1), labels[a:a + 4].flatten()) for a in (0, 4)]
    got = reference_loss(parse("pp_fsdp-pp_loss_tokens-padded"), logits, labels)
    assert torch.allclose(got, sum(mine) / 2)
    assert not torch.allclose(got, ce(logits.flatten(0, 1), labels.flatten()))


def test_the_titan_split_is_torchtitans_generated_one():
    from suites.generators.model_space import stage_blocks

    # torchtitan's _generate_llm_fqn_per_model_part(stages, blocks, 1, 1), as module names:
    # (2, 3): [tok, layers.0, layers.1], [layers.2, norm, output]; (4, 2): [tok], [layers.0], [layers.1], [norm, output]
    assert stage_blocks(parse("pp-blocks3")) == [[0, 1], [2]]
    assert stage_blocks(parse("pp")) == [[0], []]
    assert stage_blocks(parse("pp-blocks2-zbv")) == [[], [0], [1], []]
    assert stage_blocks(parse("pp-blocks3-interleaved_1f1b")) == [[0], [1], [2], []]
    assert stage_blocks(parse("pp-blocks3-zbv-split_last")) == [[], [], [], [0, 1, 2]]
    assert stage_blocks(parse("pp-blocks2-split_first")) == [[0, 1], []]


@pytest.mark.parametrize("structure", ["pp-blocks3-tied-mtp-attn-buf_rope", "pp-blocks2-moe4-top2-zbv",
                                       "pp-blocks2-frozen_lora-ac_full-zbv-split_last"])
def test_the_stages_run_one_after_another_are_the_whole_model(structure):
    """Each stage keeps the full model's parameter names and the modules its split gives it;
    chained, the stages compute the whole model's logits."""
    from suites.generators import model_structures as ms
    from suites.generators.model_pipeline import cut
    from suites.generators.model_space import stage_blocks

    s = parse(structure)
    whole = ms.build(s, torch.device("cpu"))
    tokens, _ = ms.data(s, whole.vocab, 2)[0][0]
    blocks = stage_blocks(s)
    stages = [cut(ms.build(s, torch.device("cpu")), i, blocks) for i in range(len(blocks))]
    x = tokens
    for stage in stages:
        x = stage(x)
    assert torch.equal(x, whole(tokens))
    names = [n for stage in stages for n, _ in stage.named_parameters()]
    whole_names = [n for n, _ in whole.named_parameters()]
    assert set(names) - {"output.weight"} == set(whole_names) - {"output.weight"}
    assert len(names) == len(set(names))
    assert ("output.weight" in whole_names) != s["tie"] and "output.weight" in names, "tied: the head's own copy"


def test_the_reference_loss_is_the_schedules_mean_of_microbatch_means():
    from suites.generators.model_pipeline import reference_loss

    logits, labels = torch.randn(4, 3, 5), torch.randint(0, 5, (4, 3))
    full = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    assert torch.allclose(reference_loss(parse("pp-mb4"), logits, labels), full)
    uneven = reference_loss(parse("pp-mb3"), logits, labels)  # rows 2, 1, 1
    parts = [torch.nn.functional.cross_entropy(logits[a:b].flatten(0, 1), labels[a:b].flatten())
             for a, b in ((0, 2), (2, 3), (3, 4))]
    assert torch.allclose(uneven, sum(parts) / 3) and not torch.allclose(uneven, full)
    assert torch.equal(reference_loss(parse("pp-mb3-pp_loss_tokens"), logits, labels), full)


PP_REACH = [
    # entry, --space beyond parallel=pp that the bug's trigger needs (none: the plain pp space)
    ("pytorch126600-pp-uneven-microbatches", []),
    ("torchtitan1733-pp-scale-grads-accumulation", []),
    ("distci-pp-shape-inference-extra-forward", []),
    ("distci-pp-zero-bubble-frozen-input", ["schedule=zero_bubble,zbv", "frozen=embedding,lora"]),
    ("distci-pp-zero-bubble-selective-checkpoint", ["schedule=zero_bubble,zbv", "ac=selective"]),
]


@pytest.mark.parametrize("entry, space", PP_REACH, ids=[e for e, _ in PP_REACH])
def test_the_pp_space_draws_what_each_registered_pipeline_bug_needs(entry, space):
    """The upstream PP bugs of reports/fuzz-models-2026-12-07-pp.md: the seeded run's space
    (parallel=pp) draws structures each entry names within 60 draws; the zero-bubble ones
    need their schedule and a frozen stage / selective AC, which the space draws when asked."""
    from distci.known_issues import load_registry

    registry = load_registry(REPO / "suites" / "known_issues.toml")
    known = next(e for e in registry.entries if e.id == entry)
    drawer = Drawer("2026-12-07-pp", parse_space(["parallel=pp", *space]))
    drawn = [key(drawer.draw()) for _ in range(60)]
    assert any(known.covers(f"suites/generators/models_entry.py::test_model_structure[{k}]") for k in drawn)


def test_pp_tp_takes_the_pipelines_rules_and_the_tp_plans():
    """pp_tp is a pipeline (its rules hold) whose stages a TP plan lays out (plan and
    loss_parallel are meaningful, wrap is not: no FSDP2 unit)."""
    from suites.generators.model_space import RANKS

    assert RANKS["pp_tp"] == 4, "a 2x2 (pp, tp) mesh whatever the cell's world size"
    assert valid({"parallel": "pp_tp", "plan": "titan", "loss_parallel": True, "tie": True, "schedule": "zbv",
                  "blocks": 2, "attn": True})
    assert valid({"parallel": "pp_tp", "plan": "hf", "experts": 2, "microbatches": 3})
    assert not valid({"parallel": "pp_tp", "reuse": True})
    assert not valid({"parallel": "pp_tp", "schedule": "1f1b", "microbatches": 1})
    assert not valid({"parallel": "pp_tp", "loss_parallel": True}), "loss_parallel needs plan=titan's Shard(-1) head"
    assert not valid({"parallel": "pp_tp", "plan": "hf", "tie": True})
    assert problems({"parallel": "pp_tp", "wrap": "root"}) == [
        "wrap places FSDP2's units: parallel=fsdp, hsdp, fsdp_tp or pp_fsdp"]


def test_pp_tp_grows_from_tp_draws_and_keeps_their_first_stream():
    """Every pp_tp draw is a tp draw of the first stream (its plan drawn as under tp) with a
    pipeline added; `--space parallel=pp_tp` draws only pp_tp, every plan and schedule."""
    from suites.generators.model_space import FEATURE, PIPELINE

    assert FEATURE["parallel"].origin_of("pp_tp") == "tp"
    first_only = {f.name: f.first for f in FEATURES if f.later}
    widened, plain = Drawer("2026-12-07-pptp"), Drawer("2026-12-07-pptp", first_only)
    grown, later = 0, set(PIPELINE) | {"attn", "plan", "loss_parallel", "parallel", "mesh", "family", *BATCHES}
    for _ in range(120):
        s, old = widened.draw(), plain.draw()
        assert {k: v for k, v in s.items() if k not in later} == {k: v for k, v in old.items() if k not in later}
        if s["parallel"] == "pp_tp":
            grown += 1
            assert old["parallel"] == "tp"
    assert grown > 0
    drawer = Drawer("2026-12-07-pptp", parse_space(["parallel=pp_tp"]))
    forced = [drawer.draw() for _ in range(40)]
    assert {s["parallel"] for s in forced} == {"pp_tp"}
    assert {s["plan"] for s in forced} == {"megatron", "titan", "hf"} and any(s["loss_parallel"] for s in forced)
    assert len({s["schedule"] for s in forced}) > 2


def test_pp_tp_trains_every_pipeline_on_the_same_rows():
    """pp_tp's batch is one pipeline's rows (every tp index's pipeline sees them all), its
    reference loss the pp one's."""
    from suites.generators import model_structures as ms
    from suites.generators.model_pipeline import reference_loss

    tokens, _ = ms.data(parse("pp_tp"), ms.VOCAB, 4)[0][0]
    assert tokens.shape[0] == ms.PP_ROWS and not ms.data_parallel("pp_tp")
    logits, labels = torch.randn(4, 3, 5), torch.randint(0, 5, (4, 3))
    assert torch.equal(reference_loss(parse("pp_tp-mb3"), logits, labels), reference_loss(parse("pp-mb3"), logits, labels))


def test_pp_tp_trace_rebuilds_each_microbatchs_tp_shards():
    """A plan's local output (a sequence shard per tp index) is put back together per
    microbatch before the microbatches are; a replicated output is taken once."""
    from suites.generators.model_pipeline import tp_merged

    full = torch.randn(2, 4, 3)
    seq, rep = ("forward output", "layers.0", 0), ("forward output", "norm", 0)
    ref = {(0, 0): [(seq, torch.zeros(4, 4, 3)), (rep, torch.zeros(4, 4, 3))]}
    run = {(0, 0): [[[(seq, full[:, :2]), (rep, full)], [(seq, full[:, 2:]), (rep, full)]]]}
    merged = tp_merged(run, ref)[(0, 0)][0]
    assert [k for k, _ in merged] == [seq, rep]
    assert torch.equal(merged[0][1], full) and torch.equal(merged[1][1], full)


def test_the_pp_tp_space_draws_the_uninitialized_shape_inference_bug():
    """The new PP x TP bug (reports/fuzz-models-2026-12-07-pptp.md): its seeded run's space
    draws structures the entry names (a per-expert MoE block on a stage after the first)
    within 60 draws, and leaves them out of parallel=pp, which has no TP group to diverge."""
    from distci.known_issues import load_registry

    registry = load_registry(REPO / "suites" / "known_issues.toml")
    known = next(e for e in registry.entries if e.id == "distci-pp-shape-inference-uninitialized-input")
    test = "suites/generators/models_entry.py::test_model_structure[{}]"
    drawer = Drawer("2026-12-07-pptp", parse_space(["parallel=pp_tp"]))
    assert any(known.covers(test.format(key(drawer.draw()))) for _ in range(60))
    pp = Drawer("2026-12-07-pptp", parse_space(["parallel=pp"]))
    assert not any(known.covers(test.format(key(pp.draw()))) for _ in range(60))


# --- how trainers build the layout's mesh (the later feature `mesh`) -----------------------

NIGHT_BEFORE_MESH = ["tp-blocks3-moe2-uneven-steps3", "replicate-mtp-spectral_norm-ga2-attn",
                     "hsdp-buf_persistent-frozen_lora-ac_selective-steps2-attn",
                     "pp-blocks2-moe2-steps3-attn-mb1-split_last", "fsdp_tp-reused_block-frozen_lora-steps3-attn"]
"""Seed 2026-12-07-night's first draws as the generator drew them before `mesh` existed."""


def test_the_mesh_forms_leave_a_seeds_earlier_draws_as_they_were():
    """`mesh` is the last later feature: held at direct, a seed draws what it drew before the
    feature existed, ids included; left free, a draw differs from those only by its mesh form."""
    held = Drawer("2026-12-07-night", {"mesh": ("direct",), **{f: (v,) for f, v in BATCHES.items()}})
    assert [key(held.draw()) for _ in NIGHT_BEFORE_MESH] == NIGHT_BEFORE_MESH
    free = Drawer("2026-12-07-night")
    moved = []
    for before in NIGHT_BEFORE_MESH:
        s = {**free.draw(), **BATCHES}  # the batch features come after mesh (test_fuzz_models_batches.py)
        assert {**s, "mesh": "direct"} == parse(before)
        moved += [s["mesh"]] if s["mesh"] != "direct" else []
        if s["mesh"] == "direct":
            assert key(s) == before
    assert moved, "some draw of the seed takes a mesh form"


def test_the_mesh_forms_are_drawn_where_they_mean_something():
    drawer = Drawer("2026-12-08-mesh", parse_space(["mesh=world,unflatten,from_group,singleton"]))
    drawn = [drawer.draw() for _ in range(60)]
    assert all(valid(s) and parse(key(s)) == s for s in drawn)
    assert {s["mesh"] for s in drawn} == {"world", "unflatten", "from_group", "singleton"}
    assert all(s["parallel"] == "fsdp" for s in drawn if s["mesh"] == "singleton")
    assert "pp" not in {s["parallel"] for s in drawn}
    assert {s["parallel"] for s in drawn} >= {"fsdp", "hsdp", "fsdp_tp", "tp", "ddp", "pp_fsdp", "pp_tp"}
    assert problems({"parallel": "pp", "mesh": "world"}) == [
        "parallel=pp builds no mesh (its stages talk over the world group): mesh=direct"]
    assert problems({"parallel": "hsdp", "mesh": "singleton"}) == [
        "mesh=singleton is FSDP2's 1-D data parallelism built as HSDP with one replica: parallel=fsdp"]
    assert parse("fsdp_tp-mesh_from_group")["mesh"] == "from_group"
    assert parse("hsdp-mesh_world") in smaller(parse("hsdp-blocks2-mesh_world"))
    assert parse("hsdp-blocks2") in smaller(parse("hsdp-blocks2-mesh_world")), "a find sheds a form it does not need"


def test_every_layout_names_its_axes_as_parallel_dims_does():
    """The forms slice the same axes out of torchtitan's five: each layout's names are among
    them, and their sizes multiply to the layout's world."""
    from suites.generators.model_meshes import WORLD_AXES, _degrees, axes
    from suites.generators.model_space import FEATURE, RANKS

    for parallel in FEATURE["parallel"].values:
        if parallel == "pp":
            continue
        world = RANKS.get(parallel, 2)
        shape, names = axes(parallel, world)
        assert set(names) <= set(WORLD_AXES) and len(set(names)) == len(names)
        degrees = _degrees(parallel, world)
        assert len(degrees) == len(WORLD_AXES) and __import__("math").prod(degrees) == world
        assert [degrees[WORLD_AXES.index(n)] for n in names] == list(shape)


def test_a_form_the_torch_lacks_is_left_out_with_its_reason(monkeypatch):
    """torch 2.5 .. nightly: a form whose DeviceMesh API this torch lacks skips, naming it."""
    from torch.distributed.device_mesh import DeviceMesh

    from suites.generators.model_meshes import lacks
    from suites.generators.model_space import FEATURE

    assert [lacks(form) for form in FEATURE["mesh"].values] == [None] * len(FEATURE["mesh"].values)
    monkeypatch.delattr(DeviceMesh, "_unflatten")
    monkeypatch.setattr(DeviceMesh, "from_group", staticmethod(lambda group, device_type: None))
    assert "_unflatten" in lacks("unflatten") and "from_group" in lacks("from_group")
    assert lacks("world") is None and lacks("singleton") is None
    assert all(len(lacks(form)) <= 80 for form in ("unflatten", "from_group"))


# --- model families (model_families.py) ------------------------------------------------------

def test_the_families_are_drawn_under_the_layouts_they_mean_something_in():
    drawer = Drawer("2026-12-09-family", parse_space(["family=vit,vit_mha,encdec"]))
    drawn = [drawer.draw() for _ in range(40)]
    assert all(valid(s) and parse(key(s)) == s for s in drawn)
    assert {s["family"] for s in drawn} == {"vit", "vit_mha", "encdec"}
    assert {s["parallel"] for s in drawn} == {"fsdp", "hsdp", "ddp", "replicate"}
    assert any(s["tie"] for s in drawn if s["family"] == "encdec")
    assert problems({"parallel": "tp", "family": "vit"}) == [
        "the TP plans and pipeline stages lay out the decoder LM's modules: family=vit, vit_mha "
        "or encdec takes parallel=fsdp, hsdp, ddp or replicate"]
    assert not valid({"parallel": "fsdp", "family": "vit", "tie": True})
    assert not valid({"parallel": "fsdp", "family": "encdec", "experts": 2})
    assert valid({"parallel": "hsdp", "family": "encdec", "tie": True, "wrap": "grouped", "frozen": "embedding"})
    assert parse("fsdp-vit") in smaller(parse("fsdp-wrap_root-vit")) and parse("fsdp") in smaller(parse("fsdp-vit"))


def test_a_vision_transformer_holds_its_bare_parameters_as_timm_and_torchvision_do():
    from suites.generators import model_structures as ms

    vit = ms.build(parse("fsdp-vit"), torch.device("cpu"))
    assert set(vit._parameters) == {"cls_token", "pos_embed"}, "bare Parameters on the root (FSDP2's root unit)"
    assert isinstance(vit.patch_embed.proj, torch.nn.Conv2d) and vit.layers[0].norm1.bias is not None
    assert vit.layers[0].attn.qkv.out_features == 3 * vit.layers[0].attn.proj.in_features
    attn = ms.build(parse("fsdp-vit_mha"), torch.device("cpu")).layers[0].attn
    assert isinstance(attn, torch.nn.MultiheadAttention) and "in_proj_weight" in attn._parameters
    assert type(attn.out_proj).__name__ == "NonDynamicallyQuantizableLinear"


def test_t5s_first_block_owns_the_position_bias_every_later_block_receives():
    from suites.generators import model_structures as ms

    s = parse("fsdp-blocks3-tied-encdec")
    model = ms.build(s, torch.device("cpu"))
    assert model.output.weight is model.tok.weight
    owners = [n for n, _ in model.named_modules() if n.endswith("relative_attention_bias")]
    assert owners == ["encoder.layers.0.attn.relative_attention_bias", "decoder.layers.0.attn.relative_attention_bias"]
    seen: list = []
    for block in model.decoder.layers:
        block.register_forward_hook(lambda m, args, out: seen.append((args[1], out[1])))
    tokens, labels = ms.data(s, model.vocab, 2)[0][0]
    model(tokens)
    assert seen[0][0] is None and all(given is seen[0][1] for given, _ in seen[1:]), "one tensor, passed on"
    _, grads = _grads("fsdp-blocks3-tied-encdec")
    assert grads["decoder.layers.0.attn.relative_attention_bias.weight"] is not None


def test_the_encdec_stack_units_are_the_registered_torchtitan2817():
    """family=encdec with stacks: HF's T5Stack(config, self.shared) registers the shared embedding
    in both halves, so FSDP2 units around them both claim it (torchtitan#2817): known under its
    own entry, on both messages the two mesh kinds give, never as pytorch183702's near miss."""
    from distci.known_issues import load_registry

    registry = load_registry(REPO / "suites" / "known_issues.toml")
    entry = "torchtitan2817-fsdp2-module-shared-by-two-units"
    for structure, sig in [
        ("fsdp-encdec-stack_units", "TypeError: Invariant encountered: value was None when it should not be"),
        ("hsdp-tied-wrap_nested-ga2-mesh_world-encdec-stack_units",
         "RuntimeError: Cannot concatenate overlapping meshes: [DeviceMesh((dp_replicate=N, dp_shard_cp=N)"),
    ]:
        test = f"suites/generators/models_entry.py::test_model_structure[{structure}]"
        for torch_version in ("2.13.0", "2.15.0"):
            assert registry.match(test, sig, "", Stack(torch=torch_version)) == entry
    drawer = Drawer("2026-12-09-family", parse_space(["family=encdec", "parallel=fsdp,hsdp"]))
    assert any(s["stacks"] for s in (drawer.draw() for _ in range(20))), "the generator draws the face"
    invariant = "TypeError: Invariant encountered: value was None when it should not be"
    assert registry.match("suites/generators/models_entry.py::test_model_structure[fsdp-encdec]",
                          invariant, "", Stack(torch="2.13.0")) is None
    control = "suites/generators/models_entry.py::test_model_structure[fsdp-tied-wrap_grouped-encdec-stack_units]"
    assert registry.match(control, invariant, "", Stack(torch="2.13.0")) is None, "the shared module sharded first"


def test_every_models_step_of_the_nightly_draws_what_its_space_says():
    """The nightly's models steps (the free one, the families, inductor's) each restrict the
    space with `--space`: each spec must parse, and the seed's first draws must hold to it (the
    free one compiles through aot_eager only; inductor's step compiles every structure)."""
    import shlex

    yaml = pytest.importorskip("yaml")
    from distci.fuzz.models import Drawer, parse_space

    job = yaml.safe_load((REPO / ".github" / "workflows" / "nightly.yml").read_text())["jobs"]["fuzz"]
    runs = [s["run"] for s in job["steps"] if "--generator models" in s.get("run", "")]
    assert len(runs) >= 3, runs
    for run in runs:
        words = shlex.split(run.replace('"$(date -u +%F)', '"2026-12-07'))
        specs = [words[i + 1] for i, w in enumerate(words) if w == "--space"]
        allowed = parse_space(specs)
        assert "backend" in allowed, f"every models step says which backend it compiles with: {run}"
        drawer = Drawer("nightly-step", allowed)
        for _ in range(20):
            s = drawer.draw()
            assert s is not None and all(s[name] in values for name, values in allowed.items()), (run, s)
    inductor = [r for r in runs if "backend=inductor" in r]
    assert len(inductor) == 1 and "--space compile=blocks,model" in inductor[0] and '-inductor"' in inductor[0]
