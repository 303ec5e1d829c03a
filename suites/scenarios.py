"""The scenario table: every parallelism x compile x AC x Float8 x training-step combination we run.

Declared as data, in the spirit of torchtitan's integration-test definitions: COLUMNS
declares every column once (name, values, default, id fragment, doc); the Scenario record,
its validation, its pytest id, the README coverage table and the column list below derive
from it. RULES: the invalid combinations, as (predicate, message). TABLE: the rows, in one
notation, `row(parallel, compile, backend, column=value, ...)`. One runner (training.py)
executes any row; the checks (checks.py) judge it by numbers and graphs. An id is built
from the columns in declaration order, e.g. `fsdp_tp-compile_block-ac_full-mp_bf16-ga2-ws4`;
a column at its default adds nothing (`compile` spells `eager`), so old rows keep their
ids when a column is added (declare it and its RULES here, write its rows, implement it
in training.py / step.py / parallelize.py, its expectation in checks.py).

Columns (generated from COLUMNS):
"""

from __future__ import annotations

import difflib
from typing import Any

from .columns import REQUIRED, Column, Rule, ScenarioError, describe, with_columns
from .model_args import ModelArgs

MODEL = ModelArgs()
MOE_MODEL = ModelArgs(n_experts=4, top_k=2, expert_hidden=64)
LORA_MODEL = ModelArgs(lora_rank=8)
PP_MODEL = ModelArgs(n_layers=4)
"""Four blocks: one per stage of the interleaved schedules (2 ranks x 2 stages)."""
STEPS = 3
BATCH = 2
SEED = 20251130
LR = {"sgd": 0.1, "adamw": 1e-3}
VARLEN_SEQ = (32, 24, 32, 18)
"""Sequence length per step of a `varlen` row: a new shape, one seen before, and 18,
whose sequence-parallel shards (9 per rank at TP 2, 5/5/4/4 at TP 4) are odd or uneven
where the others are even. The static rows use ModelArgs.max_seq_len every step."""
RESUME_AT = 2
"""A `resume` row trains this many steps, saves, loads under the other layout, goes on."""
MAX_VARLEN_GRAPHS_PER_REGION = 2
"""Recompile budget of a varlen row: the static graph of the first shape plus one
dynamic graph (automatic dynamic shapes) for every later length; more is a recompile
storm, fewer with all steps compiled is fine."""
TP_DEGREE_2D = 2


def _compile_part(s: Any) -> str:
    if s.compile == "none":
        return "eager"
    return f"compile_{s.compile}" + ("" if s.backend == "inductor" else f"_{s.backend}")


TIERS = ("pr", "nightly", "release")
"""Ordered: a run of tier T selects every scenario whose tier is T or earlier."""

# fmt: off
COLUMNS: tuple[Column, ...] = (
    Column("parallel", ("tp", "tp_sp", "fsdp", "fsdp_tp", "ep", "hsdp", "pp", "single"), REQUIRED, "{}",
           "tp / tp_sp: torchtitan's llama3 TP plan (sequence parallel or not), TP = ws; fsdp: FSDP2 "
           "fully_shard per block + root, dp = ws; fsdp_tp: 2-D mesh (dp_shard = ws/2, tp = 2), TP (SP) inside, "
           "FSDP2 outside; ep: experts split over the ranks, tokens moved by all-to-all; hsdp: FSDP2 on a 2-D "
           "(dp_replicate 2 x dp_shard ws/2) mesh; pp: torch.distributed.pipelining over the blocks; single: one device, no mesh (the "
           "world-size-1 slice suites/single_device.py derives from the table)", "Parallel"),
    Column("schedule", ("none", "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"), "none", "{}",
           "the pipeline schedule of a pp row (interleaved ones: two stages per rank); microbatches = accum",
           "PP schedule"),
    Column("model", ("dense", "moe"), "dense", "{}", "moe: router + top-k + experts in every block", "Model"),
    Column("compile", ("none", "model", "block"), "none", _compile_part,
           "torch.compile per block (torchtitan's default) or of the whole model, fullgraph", "Compile"),
    Column("backend", ("none", "eager", "aot_eager", "inductor"), "none", None,
           "the torch.compile backend (`none` exactly when nothing is compiled); part of the compile fragment",
           "Backend"),
    Column("ac", ("none", "full", "selective"), "none", {"full": "ac_full", "selective": "ac_sel"},
           "checkpoint_wrapper per block; selective = torchtitan's op policy", "AC"),
    Column("float8", ("none", "tensorwise", "rowwise", "rowwise_with_gw_hp"), "none", "f8_{}",
           "torchao Float8 training recipe (tensorwise under FSDP2: float8 all-gather, precomputed scales)",
           "Float8"),
    Column("async_tp", (False, True), False, {True: "asynctp"},
           "micro-pipeline TP over symmetric memory (CUDA + inductor + tp_sp only)", "Async TP"),
    Column("train", ("full", "frozen", "frozen_embed", "frozen_norms"), "full", "{}",
           "frozen: LoRA-style adapters train, the rest is frozen; frozen_embed: the token embeddings are frozen "
           "(the first block's input needs no grad); frozen_norms: every RMSNorm weight is frozen", "Train"),
    Column("shapes", ("static", "varlen"), "static", "{}",
           "varlen: the sequence length changes every step (numbers and the recompile budget)", "Shapes"),
    Column("mp", ("none", "bf16"), "none", "mp_{}",
           "FSDP2 MixedPrecisionPolicy: bf16 params, fp32 reduce (single: torch.autocast bf16)", "MP"),
    Column("accum", (1, 2, 3, 4), 1, "ga{}", "microbatches per step (gradient accumulation)", "Accum"),
    Column("loss", ("ce", "smooth_ce", "soft_ce", "z_loss"), "ce", "{}",
           "cross entropy; with label smoothing 0.1; against a teacher's soft labels (distillation, through "
           "log_softmax); plus a z-loss on logsumexp(logits)", "Loss"),
    Column("loss_compile", (False, True), False, {True: "loss_compiled"},
           "the loss function torch.compile'd with the row's backend (torchtitan's compile.components loss)",
           "Loss compiled"),
    Column("loss_parallel", (False, True), False, {True: "loss_parallel"},
           "vocab-parallel cross entropy over Shard(-1) logits, under `loss_parallel()`", "Loss parallel"),
    Column("eval", ("none", "no_grad", "inference"), "none", "eval_{}",
           "an eval forward of the trained model under no_grad / inference_mode", "Eval"),
    Column("resume", ("none", "single", "fsdp", "tp_sp"), "none", "dcp_to_{}",
           "DCP: save mid-run, load under that layout, train on", "Resume (DCP)"),
    Column("dcp", ("sync", "async"), "sync", {"async": "dcp_async"},
           "how the resume row saves: dcp.save, or dcp.async_save (waited on before loading)", "DCP save"),
    Column("clip", ("none", "norm", "foreach", "mesh"), "none", "clip_{}",
           "gradient clipping at a max norm every step: clip_grad_norm_, its foreach form, or torchtitan's "
           "per-mesh form (a norm per mesh, combined)", "Clip"),
    Column("sched", ("const", "warmup_cosine"), "const", "lr_{}",
           "LR schedule: constant, or linear warmup + cosine with two parameter groups (no weight decay on norms "
           "and biases)", "LR schedule"),
    Column("zero_grad", ("none", "zeros"), "none", "zg_{}",
           "how the optimizer clears gradients between steps: set to None, or kept as zero tensors that the "
           "next backward accumulates into (FSDP2's sharded grads, DTensor grads stay allocated)", "Zero grad"),
    Column("offload", (False, True), False, {True: "offload"}, "FSDP2 CPUOffloadPolicy (sharded params and grads "
           "on CPU, the optimizer steps there)", "Offload"),
    Column("reshard", ("titan", "true", "false", "int2"), "titan", "raf_{}",
           "FSDP2 reshard_after_forward per block: torchtitan's (all but the last block), True, False, or 2 (to "
           "2-rank groups)", "Reshard"),
    Column("routing", ("natural", "empty_first", "empty_middle", "empty_last", "one_expert"), "natural", "route_{}",
           "MoE routing edges: the router's own imbalance; an expert that gets no token in the first / a middle / "
           "the last microbatch of every step; every token to one expert", "Routing"),
    Column("world_size", (1, 2, 4), 2, "ws{}", "ranks (4-rank rows get a 4-rank pool; skipped where fewer devices)",
           "WS"),
    Column("optim", ("sgd", "adamw"), "sgd", "{}", "the optimizer", "Optim"),
    Column("tier", TIERS, "nightly", None,
           "pr: the CPU subset every PR runs (goal <= 8 min warm on 2 cores); nightly: the rest", "Tier",
           axis=False),
)
# fmt: on
COLUMN = {c.name: c for c in COLUMNS}


RULES: tuple[Rule, ...] = (
    Rule(lambda s: (s.compile == "none") != (s.backend == "none"),
         "a backend is named exactly when something is compiled (compile none <=> backend none)"),
    Rule(lambda s: s.async_tp and (s.plan != "tp_sp" or s.compile == "none" or s.backend != "inductor"),
         "async TP is an inductor pass over sequence-parallel TP: it needs plan tp_sp, compile model|block "
         "and backend inductor"),
    Rule(lambda s: s.mp != "none" and not (s.fsdp or s.parallel == "single"),
         "mixed precision is FSDP2's MixedPrecisionPolicy (autocast on one device): it needs fsdp, fsdp_tp "
         "or single"),
    Rule(lambda s: (s.parallel == "single") != (s.world_size == 1),
         "parallel single is world size 1, and world size 1 is parallel single"),
    Rule(lambda s: s.parallel == "ep" and s.model != "moe", "expert parallel needs the moe model"),
    Rule(lambda s: s.model == "moe" and s.parallel in ("tp_sp", "fsdp_tp"), "the MoE block has a TP plan for `tp` only"),
    Rule(lambda s: s.loss_parallel and s.plan is None,
         "loss parallel shards the logits over a TP dim: it needs tp, tp_sp or fsdp_tp"),
    Rule(lambda s: s.parallel == "fsdp_tp" and s.world_size % TP_DEGREE_2D,
         f"fsdp_tp needs a world size divisible by its TP degree {TP_DEGREE_2D}"),
    Rule(lambda s: s.resume != "none" and s.steps <= RESUME_AT, f"a resume row needs more than {RESUME_AT} steps"),
    Rule(lambda s: s.parallel == "hsdp" and s.world_size != 4, "hsdp is a 2 x 2 mesh: it needs world_size=4"),
    Rule(lambda s: (s.offload or s.reshard != "titan") and not s.fsdp,
         "offload and reshard are FSDP2 settings: they need fsdp, fsdp_tp or hsdp"),
    Rule(lambda s: s.reshard == "int2" and not (s.parallel == "fsdp" and s.world_size == 4),
         "reshard_after_forward=2 must divide the shard group and be smaller: it needs fsdp on 4 ranks"),
    Rule(lambda s: s.dcp != "sync" and s.resume == "none", "dcp=async is how a resume row saves: it needs resume"),
    Rule(lambda s: s.loss_compile and not s.compiled, "loss_compile uses the row's backend: it needs compile"),
    Rule(lambda s: s.routing != "natural" and (s.model != "moe" or s.compiled or s.resume != "none"),
         "routing edges steer an eager MoE router: they need model=moe, compile=none, resume=none"),
    Rule(lambda s: s.routing == "empty_middle" and s.dp_degree * s.accum < 3,
         "a middle microbatch needs at least 3 (data-parallel ranks x accum)"),
    Rule(lambda s: (s.parallel == "pp") != (s.schedule != "none"), "a schedule is named exactly for parallel=pp"),
    Rule(lambda s: s.parallel == "pp" and (s.model != "dense" or s.compiled or s.ac != "none" or s.float8 != "none"
                                           or s.eval != "none" or s.resume != "none" or s.train == "frozen"),
         "pp rows run the dense model eager, without AC, Float8, eval, resume or LoRA"),
    Rule(lambda s: s.parallel == "pp" and (s.accum < 2 or s.accum % 2),
         "pp microbatches (accum) must be a multiple of the 2 ranks, at least 2"),
    Rule(lambda s: s.train == "frozen" and s.model == "moe", "the LoRA adapters exist in the dense model only"),
    Rule(lambda s: s.sched != "const" and s.resume != "none",
         "the LR scheduler's state is not part of the resume row's checkpoint: sched needs resume=none"),
    Rule(lambda s: s.parallel == "ep" and s.clip in ("norm", "foreach"),
         "EP's experts live on their owners only: a plain clip_grad_norm_ sees one rank's; use clip=mesh"),
)


@with_columns(COLUMNS)
class Scenario:
    """One row of the table: a value for every column of COLUMNS (fields in that order)."""

    def __post_init__(self) -> None:
        for c in COLUMNS:
            value = getattr(self, c.name)
            if value not in c.values or type(value) is not c.type:
                raise ScenarioError(f"scenario column {c.name}={value!r}; allowed: "
                                    f"{', '.join(map(repr, c.values))}")
        for rule in RULES:
            if rule.broken(self):
                raise ScenarioError(f"{self.id}: {rule.message}")
        if self.tp_degree > 1:
            self.model_args.check_tp(self.tp_degree)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "Scenario":
        """A scenario from {column: value}; omitted columns take their default."""
        unknown = sorted(set(values) - set(COLUMN))
        if unknown:
            hints = {n: difflib.get_close_matches(n, COLUMN, n=1) for n in unknown}
            said = ", ".join(f"{n!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for n, h in hints.items())
            raise ScenarioError(f"unknown scenario column(s) {said}; columns: {', '.join(COLUMN)}")
        missing = [c.name for c in COLUMNS if c.default is REQUIRED and c.name not in values]
        if missing:
            raise ScenarioError(f"a scenario must name {', '.join(missing)}")
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        """{column: value} for every column, in declaration order."""
        return {c.name: getattr(self, c.name) for c in COLUMNS}

    @property
    def id(self) -> str:
        return "-".join(p for p in (c.id_part(self) for c in COLUMNS) if p)

    @property
    def plan(self) -> str | None:
        """The TP plan applied on the TP mesh dim (None: no TP)."""
        return {"tp": "tp", "tp_sp": "tp_sp", "fsdp_tp": "tp_sp"}.get(self.parallel)

    @property
    def fsdp(self) -> bool:
        return self.parallel in ("fsdp", "fsdp_tp", "hsdp")

    @property
    def tp_degree(self) -> int:
        if self.parallel in ("tp", "tp_sp"):
            return self.world_size
        return TP_DEGREE_2D if self.parallel == "fsdp_tp" else 1

    @property
    def dp_degree(self) -> int:
        """Data-parallel ranks: each sees its own slice of the global batch."""
        return self.world_size // self.tp_degree

    @property
    def data_parallel_max(self) -> int:
        """Data-parallel ranks of the widest layout the row trains in (resume rows: two)."""
        resumed = {"none": 1, "single": 1, "tp_sp": 1, "fsdp": self.world_size}[self.resume]
        return max(self.dp_degree, resumed)

    @property
    def model_args(self) -> ModelArgs:
        if self.model == "moe":
            return MOE_MODEL
        if self.parallel == "pp":
            return PP_MODEL
        return LORA_MODEL if self.train == "frozen" else MODEL

    @property
    def steps(self) -> int:
        if self.shapes == "varlen":
            return len(VARLEN_SEQ)
        return RESUME_AT + 2 if self.resume != "none" else STEPS

    def seq_len(self, step: int) -> int:
        return VARLEN_SEQ[step] if self.shapes == "varlen" else self.model_args.max_seq_len

    @property
    def compiled(self) -> bool:
        return self.compile != "none"

    @property
    def uses_inductor(self) -> bool:
        return self.compiled and self.backend == "inductor"

    @property
    def train_dtype_override(self) -> str | None:
        """Mixed-precision rows keep float32 parameters on every device (bf16 is FSDP's cast)."""
        return "float32" if self.mp != "none" else None

    @property
    def fsdp_float8_all_gather(self) -> bool:
        """FSDP2 all-gathers tensorwise Float8 weights in float8 (torchao's precomputed scales)."""
        return self.float8 == "tensorwise" and self.fsdp

    @property
    def float8_all_gather(self) -> bool:
        """Whether float8 bytes cross the wire: torchao's Float8 TP styles all-gather the
        float8 activation under sequence parallelism, FSDP2 the float8 weights."""
        return self.float8 == "tensorwise" and (self.plan == "tp_sp" or self.fsdp)

    def needs(self, device_type: str) -> list[tuple[str, tuple, str]]:
        """Markers (name, args, why) this scenario needs on `device_type` (devices.scenario_needs)."""
        from .devices import scenario_needs

        return scenario_needs(self, device_type)

    def in_tier(self, tier: str) -> bool:
        return TIERS.index(self.tier) <= TIERS.index(tier)


__doc__ += describe(COLUMNS)


def row(parallel: str, compile: str = "none", backend: str = "none", **columns: Any) -> Scenario:
    """One table row: the parallelism, what is compiled with which backend, then any other
    column by name (the rest take their defaults)."""
    return Scenario.from_dict({"parallel": parallel, "compile": compile, "backend": backend, **columns})


# fmt: off
TABLE: list[Scenario] = [
    # eager: the TP plans themselves, AC and Float8 without a compiler in the way
    row("tp", tier="pr"),
    row("tp_sp", tier="pr"),
    row("tp", optim="adamw", tier="pr"),
    row("tp_sp", ac="full", tier="pr"),
    row("tp_sp", ac="selective", tier="pr"),
    row("tp", world_size=4),
    row("tp_sp", world_size=4, optim="adamw"),
    row("tp", float8="tensorwise", tier="pr"),
    row("tp", float8="rowwise", tier="pr"),
    row("tp_sp", float8="tensorwise"),
    row("tp_sp", float8="rowwise", tier="pr"),
    row("tp_sp", float8="rowwise_with_gw_hp"),
    row("tp_sp", ac="full", float8="rowwise"),
    row("tp_sp", ac="selective", float8="tensorwise"),
    # Dynamo and AOTAutograd without inductor: tracing, functional collectives, tangents
    row("tp", "block", "eager", tier="pr"),
    row("tp", "model", "aot_eager", tier="pr"),
    row("tp_sp", "block", "aot_eager", tier="pr"),
    row("tp_sp", "model", "aot_eager", ac="full"),
    row("tp_sp", "block", "aot_eager", ac="selective"),
    row("tp_sp", "model", "eager", ac="full"),
    row("tp_sp", "block", "aot_eager", float8="tensorwise"),
    row("tp_sp", "model", "aot_eager", float8="rowwise"),
    row("tp_sp", "block", "aot_eager", world_size=4),
    # inductor: what production training runs
    row("tp", "model", "inductor", tier="pr"),
    row("tp", "block", "inductor"),
    row("tp_sp", "model", "inductor"),
    row("tp_sp", "block", "inductor", tier="pr"),
    row("tp_sp", "block", "inductor", ac="full"),
    row("tp_sp", "block", "inductor", ac="selective"),
    row("tp_sp", "model", "inductor", ac="full"),
    row("tp", "model", "inductor", optim="adamw"),
    row("tp_sp", "block", "inductor", float8="tensorwise"),
    row("tp_sp", "block", "inductor", float8="rowwise"),
    row("tp_sp", "block", "inductor", float8="rowwise_with_gw_hp"),
    row("tp_sp", "model", "inductor", float8="tensorwise"),
    row("tp_sp", "block", "inductor", ac="full", float8="rowwise"),
    row("tp_sp", "block", "inductor", ac="selective", float8="tensorwise"),
    row("tp", "block", "inductor", float8="rowwise"),
    # async TP (CUDA SM90): inductor's micro-pipeline pass must fuse collective + matmul
    row("tp_sp", "block", "inductor", async_tp=True),
    row("tp_sp", "model", "inductor", async_tp=True),
    row("tp_sp", "block", "inductor", ac="full", async_tp=True),
    row("tp_sp", "block", "inductor", ac="selective", async_tp=True),
    row("tp_sp", "block", "inductor", float8="tensorwise", async_tp=True),
    row("tp_sp", "block", "inductor", float8="rowwise", async_tp=True),
    row("tp_sp", "block", "inductor", float8="rowwise_with_gw_hp", async_tp=True),
    row("tp_sp", "block", "inductor", ac="full", float8="tensorwise", async_tp=True),
    row("tp_sp", "block", "inductor", ac="full", float8="rowwise", async_tp=True),
    row("tp_sp", "model", "inductor", float8="rowwise", async_tp=True, optim="adamw"),
    # FSDP2 alone: fully_shard per block + root, torchtitan's mixed precision and accumulation
    row("fsdp", tier="pr"),
    row("fsdp", mp="bf16"),
    row("fsdp", mp="bf16", accum=2),
    row("fsdp", accum=2, optim="adamw"),
    row("fsdp", ac="full"),
    row("fsdp", float8="rowwise"),
    row("fsdp", "block", "inductor"),
    row("fsdp", "block", "aot_eager", ac="selective"),
    row("fsdp", "model", "aot_eager"),
    row("fsdp", "block", "inductor", float8="tensorwise"),
    # 2-D: FSDP2 outside sequence-parallel TP (dp_shard 2 x tp 2), torchtitan's default
    row("fsdp_tp", world_size=4, tier="pr"),
    row("fsdp_tp", mp="bf16", accum=2, world_size=4),
    row("fsdp_tp", "block", "inductor", world_size=4),
    row("fsdp_tp", "block", "inductor", mp="bf16", world_size=4),
    row("fsdp_tp", "block", "aot_eager", ac="full", world_size=4),
    row("fsdp_tp", "model", "aot_eager", world_size=4),
    row("fsdp_tp", float8="rowwise", world_size=4),
    row("fsdp_tp", "block", "inductor", ac="full", float8="tensorwise", world_size=4),
    # frozen weights, LoRA-style adapters on the column-parallel linears
    row("tp", train="frozen", tier="pr"),
    row("tp_sp", train="frozen"),
    row("tp", "block", "aot_eager", train="frozen"),
    row("tp_sp", "block", "inductor", train="frozen"),
    row("tp_sp", "model", "inductor", train="frozen"),
    row("fsdp_tp", train="frozen", world_size=4),
    # a new sequence length every step: numbers and the recompile budget
    row("tp_sp", shapes="varlen", tier="pr"),
    row("tp", "model", "inductor", shapes="varlen"),
    row("tp_sp", "model", "aot_eager", shapes="varlen"),
    row("tp_sp", "block", "inductor", shapes="varlen"),
    row("fsdp", "block", "aot_eager", shapes="varlen"),
    # an eval forward of the trained, compiled model under no_grad / inference_mode
    row("tp", "model", "inductor", eval="no_grad"),
    row("tp_sp", "block", "inductor", eval="inference"),
    row("tp_sp", "model", "aot_eager", eval="inference"),
    row("fsdp_tp", "block", "inductor", eval="no_grad", world_size=4),
    # mixture of experts: experts TP-sharded, FSDP-sharded, or expert-parallel (all-to-all)
    row("tp", model="moe", tier="pr"),
    row("tp", "block", "aot_eager", model="moe"),
    row("tp", "block", "inductor", model="moe"),
    row("tp", model="moe", ac="full"),
    row("fsdp", model="moe", mp="bf16"),
    row("fsdp", "block", "inductor", model="moe", accum=2),
    row("ep", model="moe"),
    row("ep", model="moe", accum=2, world_size=4),
    # distributed checkpoint: save under one layout, load under another, train on
    row("tp_sp", resume="fsdp", tier="pr"),
    row("tp_sp", resume="single"),
    row("fsdp", resume="tp_sp", optim="adamw"),
    row("fsdp_tp", resume="tp_sp", world_size=4),
    row("fsdp_tp", resume="fsdp", world_size=4, optim="adamw"),
    # loss parallel: vocab-parallel cross entropy over Shard(-1) logits
    row("tp", loss_parallel=True),
    row("tp_sp", loss_parallel=True, tier="pr"),
    row("tp_sp", "model", "inductor", loss_parallel=True),
    row("fsdp_tp", loss_parallel=True, world_size=4),
]
# fmt: on


def _training_step_rows() -> list[Scenario]:
    """The step users train (issue: suites that find bugs they were not written for):
    clipping, loss variants, HSDP, FSDP2's offload and reshard settings, LR schedules,
    async checkpoints, fine-tuning's frozen parts and MoE routing edges, each crossed with
    the parallelisms users combine it with."""
    rows = [
        # clipping at max_norm: torch's clip_grad_norm_, its foreach form, torchtitan's per-mesh form
        row("fsdp", clip="norm", tier="pr"),
        row("fsdp", clip="foreach"),
        row("fsdp", clip="mesh"),
        row("fsdp", mp="bf16", accum=2, clip="norm"),
        row("fsdp", "block", "inductor", clip="norm"),
        row("fsdp", model="moe", mp="bf16", clip="norm"),
        row("fsdp_tp", world_size=4, clip="norm"),
        row("fsdp_tp", world_size=4, clip="foreach"),
        row("fsdp_tp", world_size=4, clip="mesh"),
        row("fsdp_tp", "block", "inductor", world_size=4, mp="bf16", clip="norm"),
        row("tp", clip="norm"),
        row("tp_sp", clip="norm"),
        row("tp_sp", clip="mesh"),
        row("ep", model="moe", clip="mesh"),
        row("ep", model="moe", world_size=4, accum=2, clip="mesh"),
        row("hsdp", world_size=4, clip="norm"),
        # cross entropy compiled (torchtitan compiles the loss), plain and loss-parallel
        row("tp_sp", "block", "inductor", loss_compile=True),
        row("tp", "model", "aot_eager", loss_compile=True, loss_parallel=True),
        # HSDP: replicate x shard (2 x 2)
        row("hsdp", world_size=4),
        row("hsdp", world_size=4, mp="bf16"),
        row("hsdp", world_size=4, mp="bf16", accum=2),
        row("hsdp", "block", "inductor", world_size=4),
        row("hsdp", world_size=4, train="frozen_embed"),
        row("hsdp", world_size=4, sched="warmup_cosine", optim="adamw"),
        # FSDP2 CPU offload and reshard_after_forward
        row("fsdp", offload=True),
        row("fsdp", offload=True, mp="bf16"),
        row("fsdp", offload=True, clip="norm", optim="adamw"),
        row("fsdp_tp", world_size=4, offload=True),
        row("hsdp", world_size=4, offload=True),
        row("fsdp", reshard="true"),
        row("fsdp", reshard="false"),
        row("fsdp", world_size=4, reshard="int2"),
        row("fsdp", "block", "inductor", reshard="false"),
        row("fsdp", "block", "inductor", reshard="true", mp="bf16"),
        row("fsdp_tp", world_size=4, reshard="false"),
        row("hsdp", world_size=4, reshard="true"),
        # warmup + cosine LR, two parameter groups (no weight decay on norms and biases)
        row("tp", sched="warmup_cosine", optim="adamw"),
        row("fsdp", sched="warmup_cosine"),
        row("fsdp", sched="warmup_cosine", optim="adamw", tier="pr"),
        row("fsdp_tp", world_size=4, sched="warmup_cosine", optim="adamw", clip="norm"),
        row("tp_sp", "block", "inductor", sched="warmup_cosine", optim="adamw"),
        # gradients kept as zero tensors between steps: the next backward accumulates into them
        row("fsdp", zero_grad="zeros", accum=2),
        row("fsdp_tp", world_size=4, zero_grad="zeros"),
        row("tp_sp", "block", "inductor", zero_grad="zeros"),
        row("hsdp", world_size=4, zero_grad="zeros", optim="adamw"),
        # async DCP save, then resume under another layout
        row("tp_sp", resume="fsdp", dcp="async"),
        row("fsdp", resume="tp_sp", dcp="async", optim="adamw"),
        row("fsdp_tp", world_size=4, resume="fsdp", dcp="async"),
        # a frozen base with LoRA adapters under FSDP2
        row("fsdp", train="frozen"),
        row("fsdp", "block", "inductor", train="frozen"),
        row("fsdp", "model", "aot_eager", train="frozen"),
        row("fsdp_tp", "block", "inductor", world_size=4, train="frozen"),
        row("tp", "block", "inductor", train="frozen_embed"),
    ]
    # loss variants: plain, under loss_parallel(), compiled (with and without loss parallel)
    for loss in ("smooth_ce", "soft_ce", "z_loss"):
        rows += [
            row("tp", loss=loss),
            row("fsdp", loss=loss),
            row("tp", loss=loss, loss_parallel=True),
            row("tp_sp", loss=loss, loss_parallel=True),
            row("fsdp_tp", world_size=4, loss=loss, loss_parallel=True),
            row("tp_sp", "block", "inductor", loss=loss, loss_compile=True),
            row("tp_sp", "block", "aot_eager", loss=loss, loss_compile=True, loss_parallel=True),
        ]
    # frozen the way fine-tuning freezes: x per-block and whole-model compile x SP x FSDP2
    for train in ("frozen_embed", "frozen_norms"):
        rows += [
            row("tp_sp", train=train),
            row("tp_sp", "block", "inductor", train=train),
            row("tp_sp", "model", "inductor", train=train),
            row("tp_sp", "block", "aot_eager", train=train),
            row("fsdp", train=train),
            row("fsdp", "block", "inductor", train=train),
            row("fsdp", "model", "aot_eager", train=train),
            row("fsdp", mp="bf16", train=train),
            row("fsdp_tp", world_size=4, train=train),
            row("fsdp_tp", "block", "inductor", world_size=4, train=train),
        ]
    # MoE routing edges x mixed precision x accumulation x FSDP2 and EP
    for edge in ("empty_first", "empty_middle", "empty_last", "one_expert"):
        rows += [
            row("fsdp", model="moe", accum=2, routing=edge),
            row("fsdp", model="moe", accum=2, mp="bf16", routing=edge),
            row("ep", model="moe", accum=2, routing=edge),
        ]
        if edge != "one_expert":
            rows.append(row("tp", model="moe", accum=3, routing=edge))
    rows.append(row("ep", model="moe", world_size=4, accum=2, routing="empty_middle", clip="mesh"))
    # pipeline parallel: every schedule, microbatches, clipping across stages, frozen parts
    for schedule in ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"):
        rows += [row("pp", schedule=schedule, accum=2), row("pp", schedule=schedule, accum=4, clip="mesh")]
    rows += [row("pp", schedule="1f1b", accum=2, optim="adamw", sched="warmup_cosine"),
             row("pp", schedule="interleaved_1f1b", accum=2, train="frozen_embed"),
             row("pp", schedule="gpipe", accum=2, loss="z_loss")]
    return rows


TABLE += _training_step_rows()

SCENARIOS: dict[str, Scenario] = {}
for _s in TABLE:
    if _s.id in SCENARIOS:
        raise ScenarioError(f"two scenario rows share the id {_s.id!r}")
    SCENARIOS[_s.id] = _s
