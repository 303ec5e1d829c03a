"""The models generator's space: a model structure is one value per feature, each a thing
production models do that the table's one Transformer does not.

Features, and where they come from:
  - experts / top_k / shared_expert: MoE written as real MoE code writes it, a Python loop
    over the experts that runs only those that got a token (HF Mixtral / Qwen-MoE's
    `expert_hit` loop, torchtitan's GroupedExperts for-loop path): an expert no token
    reached neither runs nor gets a gradient on that rank; a shared expert every token
    passes (Qwen2-MoE, DeepSeek-MoE);
  - tie: the output head holds the token embedding's weight (Llama 3.2 1B/3B, Gemma);
  - reuse: one block applied twice per forward (ALBERT, Universal Transformers): one set of
    parameters, two uses, two backward contributions;
  - mtp: a multi-token-prediction module that holds and calls the output head a second time
    (DeepSeek-V3's MTP modules share the embedding and the output head; Megatron-LM's
    MultiTokenPredictionBlock): one head, two callers, one of them a child of another module;
  - buffer: `rope`, a non-persistent cos/sin cache built at init (Llama's rotary cache); or
    `persistent`, a persistent per-channel scale buffer read in forward;
  - param: the feed-forward's first projection under torch.nn.utils.parametrizations
    (weight_norm: wav2vec2 / HiFi-GAN; spectral_norm: GAN discriminators, with its u/v
    buffers updated by every training forward);
  - wrap: FSDP2 units as trainers place them: every block (+ root), the root only, a subset
    (the first block only), nested (each block's feed-forward, then the block, then root),
    grouped (every block, then one unit of several modules, `fully_shard([model.norm,
    model.output])` as torchtitan's llama3/deepseek_v3 parallelize.py and PyTorch's own
    "mem_eff" tests write it; the tied embedding and the MTP module join that unit);
  - frozen: parameters that never train: `embedding`, a frozen token embedding (and the
    head it is tied to; HF `model.get_input_embeddings().requires_grad_(False)`); `lora`,
    every feed-forward projection wrapped PEFT-style (base_layer + lora_A + lora_B, B zero at
    init) and every base parameter frozen, as torchtune's LoRA recipes do
    (`set_trainable_params(model, get_adapter_params(model))`, then fully_shard per layer);
  - ac: activation checkpointing per block as torchtitan's apply_ac wraps every block
    (`ptd_checkpoint_wrapper(block, preserve_rng_state=False)`): `full`, or `selective`
    (op-level SAC: matmul outputs saved, the rest recomputed,
    create_selective_checkpoint_contexts);
  - balance: DeepSeek-V3's auxiliary-loss-free load balancing as torchtitan writes it
    (moe.py's `expert_bias` / `tokens_per_expert` buffers, optimizer.py's
    `_update_expert_bias` step pre-hook): a bias that only steers expert selection, updated
    outside autograd from the token counts all-reduced over the data-parallel ranks;
  - uneven: widths no mesh divides (vocab 33, hidden 31): padded FSDP2 shards, uneven TP shards;
  - parallel: the layout (FSDP2, TP, classic DDP, composable replicate), crossed with all;
    `hsdp` is the 2-D layout torchtitan's ParallelDims builds for dp_replicate x dp_shard
    (fully_shard over a ("dp_replicate", "dp_shard") mesh): always 4 ranks, a 2x2 mesh,
    whatever the cell's world size (RANKS);
  - accum, steps: microbatches per step, optimizer steps;
  - later features (drawn from a stream of their own, LATER below): `attn`, Llama's
    attention in every block (wq/wk/wv/wo, causal SDPA, the rope cache passed to it as
    torchtitan passes freqs_cis); `plan`, the TP plan a trainer writes (model_plans.py:
    megatron, torchtitan's apply_tp with sequence parallel, transformers' tp_plan strings);
    `loss_parallel`, torchtitan's vocab-sharded logits under `loss_parallel()`; and the
    layout `fsdp_tp`, TP inside each group of a 2x2 ("dp_shard", "tp") mesh then
    fully_shard over "dp_shard", as torchtitan's parallelize_llama (4 ranks, RANKS); it
    grows from an fsdp draw (its wrap kept): FSDP2 with a TP axis added.
  - the pipeline (later): the layout `pp`, grown from a ddp draw (the data-parallel layout
    whose ranks a pipeline splits the model over instead), always 2 ranks: torchtitan's
    pipeline_llm over torch.distributed.pipelining (model_pipeline.py); `schedule` (GPipe,
    1F1B, Interleaved1F1B, interleaved zero bubble, ZBV, DualPipeV), `microbatches` (1-4
    over the step's 4 rows: 3 does not divide them), `split` (torchtitan's generated split,
    or every block on the first / last stage) and `pp_loss` (a per-microbatch mean with
    scale_grads, or torchtitan's sum over the step's tokens without).
  - the pipeline x FSDP2 (later): the layout `pp_fsdp`, grown from an hsdp draw (the same
    2x2 mesh, its wrap kept), torchtitan's PP x FSDP2: a ("pp", "dp_shard") mesh, each stage
    `fully_shard`ed over dp_shard, each dp_shard index's pipeline on its own rows (4 ranks).
  - the pipeline x TP (later): the layout `pp_tp`, grown from a tp draw (its plan and
    loss_parallel kept), torchtitan's PP x TP: a 2x2 ("pp", "tp") mesh, each stage laid out
    by the drawn plan over "tp" (sequence parallel, loss_parallel on the last stage under
    plan=titan), each tp index's pipeline on the same rows (4 ranks).
  - family (later): the model family (model_families.py): `lm`, the decoder LM every
    other feature describes; `vit`, timm's vision transformer (Conv2d patch embedding, the
    class token and position embedding bare Parameters on the root module, LayerNorm with
    bias, fused qkv + unbind, class-token pooling, a classification head); `vit_mha`, the
    same with torchvision's nn.MultiheadAttention; `encdec`, T5 (one shared embedding for the
    encoder's and the decoder's tokens, the head tied to it under tie, a relative position
    bias only each stack's first block owns and every later block receives, cross
    attention). Under fsdp, hsdp, ddp, replicate; with blocks, wrap, frozen=embedding (the
    patch / shared embedding), ac, accum, steps, mesh; reuse for the vision transformers,
    tie for encdec. `stacks` (later, after family): FSDP2 units around the encoder and the
    decoder too (blocks, then each stack, then the root), as a trainer that shards an
    encoder-decoder's (or a VLM's) halves writes `fully_shard(model.encoder)`; HF registers
    the shared embedding in both stacks (`T5Stack(config, self.shared)`), so two units hold it.
  - mesh (later): how the trainer builds the layout's mesh (model_meshes.py): `direct`, one
    init_device_mesh of the layout's axes; `world`, a slice of torchtitan's five-axis
    ParallelDims mesh (size-1 axes kept, FSDP2 over the flattened dp_shard_cp); `unflatten`,
    the same sliced from a 1-D world mesh's `_unflatten`; `from_group`, DeviceMesh.from_group
    over existing process groups; `singleton`, fsdp as HSDP on a (1, N) mesh.

  - compile (later, model_compile.py): `blocks`, each block `torch.compile`d after TP and
    before FSDP2 (torchtitan's apply_compile, torchtune); `model`, the whole model the step
    calls (HF / accelerate's dynamo_backend, over DDP: Dynamo's DDPOptimizer); `backend`,
    aot_eager or inductor. The reference stays eager.
  - the batches (later, model_batches.py), as trainers feed them: `seq`, the sequence
    length (fixed; odd, one the TP degree does not divide; one, single-token steps; varied,
    each batch its own: HF's dynamic padding / group_by_length); `pad`, right-padded rows
    with -100 labels (HF's collators), so ranks hold different numbers of valid tokens;
    `loss`, how the step averages them (each shard's mean; torchtitan's sum over the global
    valid-token count with FSDP2's gradient division off; HF's num_items_in_batch).

A structure's key spells the parallelism then every feature off its default, e.g.
`ddp-blocks2-moe4-top2-tied-steps2`; `parse` reads one back (a test id alone names its
structure). RULES say what is meaningless, never what is broken upstream. Importable
without torch: the controller draws and shrinks here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

Structure = Mapping[str, Any]


@dataclass(frozen=True)
class Feature:
    """One feature: its values (shrinking walks toward `default`), its id fragment, its doc."""

    name: str
    values: tuple
    default: Any
    fragment: str
    doc: str
    later: tuple = ()
    """Values only the later stream draws (distci/fuzz/models.py): appended after a seed's
    first draws were fixed, so those draws keep their ids."""
    grows_from: Any = None
    """The value a later value replaces (None: the default), e.g. fsdp_tp grows from fsdp;
    a dict names it per later value (pp grows from ddp)."""

    @property
    def first(self) -> tuple:
        """The values the first stream draws."""
        return tuple(v for v in self.values if v not in self.later)

    def origin_of(self, value: Any) -> Any:
        """The first-stream value `value` (a later one) replaces."""
        if isinstance(self.grows_from, dict):
            return self.grows_from.get(value, self.default)
        return self.default if self.grows_from is None else self.grows_from


FEATURES: tuple[Feature, ...] = (
    Feature("parallel", ("fsdp", "tp", "ddp", "replicate", "hsdp", "fsdp_tp", "pp", "pp_fsdp", "pp_tp"), "fsdp",
            "{}", "the layout over all ranks", later=("fsdp_tp", "pp", "pp_fsdp", "pp_tp"),
            grows_from={"fsdp_tp": "fsdp", "pp": "ddp", "pp_fsdp": "hsdp", "pp_tp": "tp"}),
    Feature("blocks", (1, 2, 3), 1, "blocks{}", "residual blocks"),
    Feature("experts", (0, 2, 4), 0, "moe{}", "routed experts in every block's feed-forward (0: a dense MLP)"),
    Feature("top_k", (1, 2), 1, "top{}", "experts each token goes to"),
    Feature("shared_expert", (False, True), False, "shared_expert", "an expert every token passes"),
    Feature("tie", (False, True), False, "tied", "the output head holds the embedding's weight"),
    Feature("reuse", (False, True), False, "reused_block", "the first block runs again after the last"),
    Feature("mtp", (False, True), False, "mtp", "a multi-token-prediction module that calls the output head again"),
    Feature("buffer", ("none", "rope", "persistent"), "none", "buf_{}", "a buffer read in every block's forward"),
    Feature("param", ("none", "weight_norm", "spectral_norm"), "none", "{}", "a parametrized first projection"),
    Feature("wrap", ("blocks", "root", "subset", "nested", "grouped"), "blocks", "wrap_{}", "FSDP2 units"),
    Feature("frozen", ("none", "embedding", "lora"), "none", "frozen_{}", "parameters that never train"),
    Feature("ac", ("none", "full", "selective"), "none", "ac_{}", "activation checkpointing of every block"),
    Feature("balance", (False, True), False, "lb_bias", "an expert-selection bias updated from token counts"),
    Feature("uneven", (False, True), False, "uneven", "vocab 33 and hidden 31: no mesh divides them"),
    Feature("accum", (1, 2), 1, "ga{}", "microbatches per optimizer step"),
    Feature("steps", (1, 2, 3), 1, "steps{}", "optimizer steps"),
    Feature("attn", (False, True), False, "attn", "Llama attention (wq/wk/wv/wo) in every block", later=(True,)),
    Feature("plan", ("megatron", "titan", "hf"), "megatron", "plan_{}", "the TP plan (model_plans.py)",
            later=("titan", "hf")),
    Feature("loss_parallel", (False, True), False, "loss_parallel", "vocab-sharded logits, loss_parallel()",
            later=(True,)),
    # microbatches before schedule: the later stream checks each move against the features before
    # it, and DualPipeV takes no fewer microbatches than its 4 stages
    Feature("microbatches", (2, 1, 3, 4), 2, "mb{}", "the schedule's n_microbatches over the step's 4 rows",
            later=(1, 3, 4)),
    Feature("schedule", ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zbv", "dualpipev"), "gpipe", "{}",
            "the pipeline schedule (suites/runner/pipeline.py SCHEDULES)",
            later=("1f1b", "interleaved_1f1b", "zero_bubble", "zbv", "dualpipev")),
    Feature("split", ("titan", "first", "last"), "titan", "split_{}", "which blocks each pipeline stage holds",
            later=("first", "last")),
    Feature("pp_loss", ("mean", "tokens"), "mean", "pp_loss_{}",
            "the microbatch loss: a mean with scale_grads, or torchtitan's sum over the step's tokens",
            later=("tokens",)),
    Feature("mesh", ("direct", "world", "unflatten", "from_group", "singleton"), "direct", "mesh_{}",
            "how the trainer builds the layout's mesh (model_meshes.py)",
            later=("world", "unflatten", "from_group", "singleton")),
    Feature("family", ("lm", "vit", "vit_mha", "encdec"), "lm", "{}",
            "the model family (model_families.py): the decoder LM, a vision transformer, T5",
            later=("vit", "vit_mha", "encdec")),
    # after family: the later stream weighs a move against the features before it
    Feature("stacks", (False, True), False, "stack_units",
            "FSDP2 units around the encoder and the decoder, each holding the shared embedding (HF T5Stack)",
            later=(True,)),
    # the batches as trainers feed them (model_batches.py); after stacks, so every earlier
    # feature's later-stream numbers stay what they were
    Feature("seq", ("fixed", "odd", "one", "varied"), "fixed", "seq_{}",
            "sequence lengths: fixed, one the TP degree does not divide, 1, or each batch its own",
            later=("odd", "one", "varied")),
    Feature("pad", (False, True), False, "padded", "right-padded rows, labels -100 past each row's length",
            later=(True,)),
    Feature("loss", ("mean", "tokens", "items"), "mean", "loss_{}",
            "each shard's mean, torchtitan's global valid-token count, or HF's num_items_in_batch",
            later=("tokens", "items")),
    # torch.compile as trainers apply it (model_compile.py); last, so every earlier feature's
    # later-stream numbers stay what they were
    Feature("compile", ("none", "blocks", "model"), "none", "compile_{}",
            "torch.compile of each block (torchtitan, torchtune) or of the whole model (HF / accelerate)",
            later=("blocks", "model")),
    Feature("backend", ("aot_eager", "inductor"), "aot_eager", "{}", "the compiled structure's backend",
            later=("inductor",)),
)
FEATURE = {f.name: f for f in FEATURES}
RANKS = {"hsdp": 4, "fsdp_tp": 4, "pp": 2, "pp_fsdp": 4, "pp_tp": 4}
"""Layouts that need a world of their own size (a 2x2 mesh; pp: two pipeline ranks, so its
stage counts are fixed); the rest run on the cell's ranks."""
SIZES = ("blocks", "experts", "top_k", "accum", "steps", "microbatches")
PIPELINE = ("schedule", "microbatches", "split", "pp_loss")
"""Features that configure a pipeline (parallel=pp or pp_fsdp)."""
PIPELINED = ("pp", "pp_fsdp", "pp_tp")
"""The layouts with a pipeline: pp on 2 ranks; pp_fsdp and pp_tp the same 2 stages' ranks
times 2 dp_shard / tp ranks."""
TP_LAYOUTS = ("tp", "fsdp_tp", "pp_tp")
"""The layouts a TP plan lays out (the plan feature)."""
FSDP_LAYOUTS = ("fsdp", "hsdp", "fsdp_tp", "pp_fsdp")
FAMILY_LAYOUTS = ("fsdp", "hsdp", "ddp", "replicate")
"""The layouts a family other than lm runs under: TP plans and pipeline stages name the LM's
modules (tok, wq/wk/wv/wo, w1/w2, output: model_plans.py, model_pipeline.py)."""
LM_ONLY = ("experts", "top_k", "shared_expert", "mtp", "buffer", "param", "balance", "uneven", "attn")
"""Features that describe the decoder LM's modules (its routed feed-forward, MTP head, rope
cache, parametrized projection, Llama attention, vocab width); no other family has them."""
VISION = ("vit", "vit_mha")
"""The layouts that place FSDP2 units (the wrap feature)."""
PP_RANKS = RANKS["pp"]
STAGES_PER_RANK = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2, "zero_bubble": 2, "zbv": 2, "dualpipev": 2}
"""As suites/runner/pipeline.py SCHEDULES has them (this module imports no torch)."""


def n_stages(s: Structure) -> int:
    return PP_RANKS * STAGES_PER_RANK[s["schedule"]]


def stage_blocks(s: Structure) -> list[list[int]]:
    """The blocks each stage holds. titan: torchtitan's `_generate_llm_fqn_per_model_part`
    (the embedding and the head each weigh one block; the first stages take the extra);
    first / last: every block on the first / the last stage (torchtitan's
    `module_fqns_per_model_part` written by hand), the other stages ends or nothing."""
    stages, blocks = n_stages(s), s["blocks"]
    if s["split"] != "titan":
        at = 0 if s["split"] == "first" else stages - 1
        return [list(range(blocks)) if i == at else [] for i in range(stages)]
    per, extra = divmod(blocks + 2, stages)
    out, next_block = [], 0
    for i in range(stages):
        take = per + (i < extra) - (i == 0) - (i == stages - 1)
        out.append(list(range(next_block, min(blocks, next_block + max(take, 0)))))
        next_block += max(take, 0)
    return out
"""Numbers: the shrinker tries every smaller value, the smallest first."""

RULES: tuple[tuple[Any, str], ...] = (
    (lambda s: s["top_k"] > max(s["experts"], 1), "top_k picks among the routed experts: top_k <= experts"),
    (lambda s: s["shared_expert"] and not s["experts"], "a shared expert sits beside routed experts: experts > 0"),
    (lambda s: s["wrap"] != "blocks" and s["parallel"] not in FSDP_LAYOUTS,
     "wrap places FSDP2's units: parallel=fsdp, hsdp, fsdp_tp or pp_fsdp"),
    (lambda s: s["balance"] and not s["experts"], "the balancing bias steers routed experts: experts > 0"),
    (lambda s: s["plan"] != "megatron" and s["parallel"] not in TP_LAYOUTS,
     "plan is a TP plan: parallel=tp, fsdp_tp or pp_tp"),
    (lambda s: s["loss_parallel"] and s["plan"] != "titan",
     "loss_parallel reads the head's Shard(-1) logits, which plan=titan makes"),
    (lambda s: s["plan"] == "hf" and s["tie"],
     "transformers' plan shards the head (colwise_rep) and not the embedding: a tied pair "
     "cannot stay one parameter under plan=hf"),
    (lambda s: s["parallel"] not in PIPELINED and any(s[f] != FEATURE[f].default for f in PIPELINE),
     "schedule, microbatches, split and pp_loss configure a pipeline: parallel=pp, pp_fsdp or pp_tp"),
    (lambda s: s["parallel"] in PIPELINED and s["reuse"],
     "a module runs in one pipeline stage: the reused first block cannot run again after the last"),
    (lambda s: s["parallel"] in PIPELINED and s["schedule"] in ("1f1b", "dualpipev") and s["microbatches"] < n_stages(s),
     "Schedule1F1B and ScheduleDualPipeV take no fewer microbatches than stages"),
    (lambda s: s["parallel"] in PIPELINED and s["split"] == "titan" and s["blocks"] + 2 < n_stages(s),
     "torchtitan's split weighs the embedding and the head as one block each: blocks + 2 >= stages"),
    (lambda s: s["parallel"] in PIPELINED and s["param"] == "spectral_norm" and s["microbatches"] > 1,
     "spectral_norm's power iteration runs once per forward: n microbatches run it n times "
     "where the full-batch reference runs it once"),
    (lambda s: s["plan"] == "titan" and s["buffer"] == "rope" and not s["attn"],
     "torchtitan's plan hands the rope cache to attention (PrepareModuleInput's None): "
     "plan=titan with buffer=rope needs attn"),
    (lambda s: s["mesh"] != "direct" and s["parallel"] == "pp",
     "parallel=pp builds no mesh (its stages talk over the world group): mesh=direct"),
    (lambda s: s["mesh"] == "singleton" and s["parallel"] != "fsdp",
     "mesh=singleton is FSDP2's 1-D data parallelism built as HSDP with one replica: parallel=fsdp"),
    (lambda s: s["family"] != "lm" and s["parallel"] not in FAMILY_LAYOUTS,
     "the TP plans and pipeline stages lay out the decoder LM's modules: family=vit, vit_mha "
     "or encdec takes parallel=fsdp, hsdp, ddp or replicate"),
    (lambda s: s["family"] != "lm" and any(s[f] != FEATURE[f].default for f in LM_ONLY),
     "experts, top_k, shared_expert, mtp, buffer, param, balance, uneven and attn describe "
     "the decoder LM's modules: family=vit, vit_mha and encdec have none of them"),
    (lambda s: s["family"] != "lm" and s["frozen"] == "lora",
     "frozen=lora wraps the LM's feed-forward projections (w1, w2): family=lm"),
    (lambda s: s["family"] in VISION and s["tie"],
     "a vision transformer's head has no token embedding to hold: tie needs family=lm or encdec"),
    (lambda s: s["stacks"] and (s["family"] != "encdec" or s["parallel"] not in ("fsdp", "hsdp")),
     "stacks places FSDP2 units around an encoder-decoder's two stacks: family=encdec, "
     "parallel=fsdp or hsdp"),
    (lambda s: s["family"] in VISION and (s["seq"] != "fixed" or s["pad"] or s["loss"] != "mean"),
     "seq, pad and loss shape token sequences and their labels: a vision transformer takes "
     "images with one label each"),
    (lambda s: s["seq"] == "varied" and s["steps"] * s["accum"] == 1,
     "seq=varied gives each batch its own length: it needs a second batch (steps or accum > 1)"),
    (lambda s: s["pad"] and s["seq"] == "one",
     "a padded row keeps at least one token: rows of one token have nothing to pad"),
    (lambda s: s["loss"] != "mean" and s["parallel"] in PIPELINED,
     "a pipeline's loss is its schedule's (pp_loss=tokens is torchtitan's): loss configures "
     "the step of the other layouts"),
    (lambda s: s["loss"] == "tokens" and s["parallel"] in ("ddp", "replicate"),
     "loss=tokens turns FSDP2's gradient division off (torchtitan's disable_fsdp_gradient_division); "
     "DDP has no divide factor: its global-token loss is loss=items (HF scales the loss by the "
     "data-parallel degree)"),
    (lambda s: s["family"] == "encdec" and s["reuse"],
     "reuse runs the first block again after the last: family=encdec has two stacks of blocks, "
     "the first of each computing that stack's position bias"),
    (lambda s: s["backend"] != "aot_eager" and s["compile"] == "none",
     "backend names the compiler of a compiled structure: compile=blocks or model"),
    (lambda s: s["compile"] == "model" and s["parallel"] in PIPELINED,
     "a pipeline's schedule calls its stage modules, never the whole model: compile=model has "
     "nothing to compile there (torchtitan compiles each stage's blocks: compile=blocks)"),
)
"""Only what is meaningless (a structure that cannot be built as stated)."""


def complete(structure: Structure) -> dict[str, Any]:
    """Every feature, missing ones at their default; an unknown feature or value is a ValueError."""
    unknown = sorted(set(structure) - set(FEATURE))
    if unknown:
        raise ValueError(f"unknown model feature(s) {', '.join(unknown)}; features: {', '.join(FEATURE)}")
    full = {f.name: structure.get(f.name, f.default) for f in FEATURES}
    for f in FEATURES:
        if full[f.name] not in f.values or type(full[f.name]) is not type(f.default):
            raise ValueError(f"model feature {f.name}={full[f.name]!r}; values: {', '.join(map(str, f.values))}")
    return full


def problems(structure: Structure) -> list[str]:
    """Why `structure` is meaningless (empty: it is not)."""
    try:
        full = complete(structure)
    except ValueError as exc:
        return [str(exc)]
    return [message for broken, message in RULES if broken(full)]


def valid(structure: Structure) -> bool:
    return not problems(structure)


def _fragment(f: Feature, value: Any) -> str:
    return f.fragment if "{}" not in f.fragment else f.fragment.format(value)


def key(structure: Structure) -> str:
    """The structure's id: the parallelism, then every feature off its default."""
    full = complete(structure)
    parts = [full["parallel"]]
    parts += [_fragment(f, full[f.name]) for f in FEATURES[1:] if full[f.name] != f.default]
    return "-".join(parts)


def parse(text: str) -> dict[str, Any]:
    """The structure a key names (ValueError naming the token that is no feature)."""
    tokens = text.strip().split("-")
    out: dict[str, Any] = {}
    if tokens[0] not in FEATURE["parallel"].values:
        raise ValueError(f"{text!r}: starts with {tokens[0]!r}, not a layout of {FEATURE['parallel'].values}")
    out["parallel"] = tokens[0]
    table = {_fragment(f, v): (f.name, v) for f in FEATURES[1:] for v in f.values if v != f.default}
    for token in tokens[1:]:
        if token not in table:
            raise ValueError(f"{text!r}: {token!r} is no model feature; fragments: {', '.join(sorted(table))}")
        name, value = table[token]
        out[name] = value
    return complete(out)


def non_default(structure: Structure) -> dict[str, Any]:
    """The features of `structure` off their default (what a shrunk failure needs)."""
    full = complete(structure)
    return {f.name: full[f.name] for f in FEATURES if full[f.name] != f.default}

