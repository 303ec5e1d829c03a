"""The scenario table: every parallelism x compile x AC x Float8 x training-mode combination we run.

Declared as data, one row per scenario, in the spirit of torchtitan's integration-test
definitions; one runner (suites/training.py) executes any row, and the checks
(suites/checks.py) judge it by numbers and graphs. A scenario's pytest id is built from
its columns, e.g. `fsdp_tp-compile_block-ac_full-mp_bf16-ga2-ws4`: default values
(inductor backend, no AC, no Float8, world size 2, SGD, full training, static shapes,
...) are left out of the id, so the rows that existed before a column was added keep
their ids.

Columns:
  parallel  tp | tp_sp | fsdp | fsdp_tp | ep | single
            tp / tp_sp: torchtitan's llama3 TP plan, sequence parallel or not, TP = ws;
            fsdp: FSDP2 fully_shard per block + root, dp = ws;
            fsdp_tp: 2-D mesh (dp_shard = ws/2, tp = 2), TP (sequence parallel) inside,
            FSDP2 outside, as torchtitan composes them;
            ep: expert parallel (MoE only): experts split over the ranks, tokens moved by
            all-to-all; dense weights replicated, data parallel (gradients averaged)
            single: one device, no mesh (world size 1): the rows suites/single_device.py
            derives from the table, so a one-GPU runner trains every row's kernels
  compile   none | model | block             (always fullgraph=True)
  backend   eager | aot_eager | inductor     (`-` when compile is none)
  ac        none | full | selective          (checkpoint_wrapper; selective = torchtitan's op policy)
  float8    none | tensorwise | rowwise | rowwise_with_gw_hp
            (tensorwise under FSDP2: float8 all-gather with precomputed scales)
  async_tp  micro-pipeline TP over symmetric memory (CUDA + inductor + tp_sp only)
  ws        world size (4-rank rows get a 4-rank pool; skipped where fewer devices)
  optim     sgd | adamw
  tier      pr (CPU subset for every PR, <= 10 min on 2 cores) | nightly (the rest)
  model     dense | moe                      (moe: router + top-k + experts in every block)
  train     full | frozen                    (frozen: LoRA-style adapters train, the rest is frozen)
  shapes    static | varlen                  (varlen: the sequence length changes every step)
  mp        none | bf16                      (FSDP2 MixedPrecisionPolicy: bf16 params, fp32 reduce;
                                             single: torch.autocast bf16, as torchtitan without FSDP)
  accum     microbatches per step (gradient accumulation)
  eval      none | no_grad | inference       (an eval forward of the trained model)
  loss      plain | parallel                 (vocab-parallel cross entropy, `loss_parallel()`)
  resume    none | single | fsdp | tp_sp     (DCP: save mid-run, load under that layout, go on)
"""

from __future__ import annotations

from dataclasses import dataclass

from .model_args import ModelArgs

PARALLELS = ("tp", "tp_sp", "fsdp", "fsdp_tp", "ep", "single")
COMPILES = ("none", "model", "block")
BACKENDS = ("none", "eager", "aot_eager", "inductor")
ACS = ("none", "full", "selective")
FLOAT8S = ("none", "tensorwise", "rowwise", "rowwise_with_gw_hp")
OPTIMS = ("sgd", "adamw")
TIERS = ("pr", "nightly", "release")
"""Ordered: a run of tier T selects every scenario whose tier is T or earlier."""
MODELS = ("dense", "moe")
TRAINS = ("full", "frozen")
SHAPES = ("static", "varlen")
MPS = ("none", "bf16")
EVALS = ("none", "no_grad", "inference")
LOSSES = ("plain", "parallel")
RESUMES = ("none", "single", "fsdp", "tp_sp")

MODEL = ModelArgs()
MOE_MODEL = ModelArgs(n_experts=4, top_k=2, expert_hidden=64)
LORA_MODEL = ModelArgs(lora_rank=8)
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


@dataclass(frozen=True)
class Scenario:
    parallel: str
    compile: str
    backend: str
    ac: str
    float8: str
    async_tp: bool
    world_size: int
    optim: str
    tier: str
    model: str = "dense"
    train: str = "full"
    shapes: str = "static"
    mp: str = "none"
    accum: int = 1
    eval: str = "none"
    loss: str = "plain"
    resume: str = "none"

    def __post_init__(self) -> None:
        for value, allowed, column in (
            (self.parallel, PARALLELS, "parallel"),
            (self.compile, COMPILES, "compile"),
            (self.backend, BACKENDS, "backend"),
            (self.ac, ACS, "ac"),
            (self.float8, FLOAT8S, "float8"),
            (self.optim, OPTIMS, "optim"),
            (self.tier, TIERS, "tier"),
            (self.model, MODELS, "model"),
            (self.train, TRAINS, "train"),
            (self.shapes, SHAPES, "shapes"),
            (self.mp, MPS, "mp"),
            (self.eval, EVALS, "eval"),
            (self.loss, LOSSES, "loss"),
            (self.resume, RESUMES, "resume"),
        ):
            if value not in allowed:
                raise ValueError(f"scenario column {column}={value!r}; allowed: {', '.join(allowed)}")
        if (self.compile == "none") != (self.backend == "none"):
            raise ValueError(f"scenario compile={self.compile!r} with backend={self.backend!r}: "
                             "a backend is named exactly when something is compiled")
        if self.async_tp and (self.plan != "tp_sp" or self.compile == "none" or self.backend != "inductor"):
            raise ValueError(f"{self.id}: async TP is an inductor pass over sequence-parallel TP: "
                             "it needs plan tp_sp, compile model|block and backend inductor")
        if self.mp != "none" and not (self.fsdp or self.parallel == "single"):
            raise ValueError(f"{self.id}: mixed precision is FSDP2's MixedPrecisionPolicy (autocast on one device): "
                             "it needs fsdp, fsdp_tp or single")
        if (self.parallel == "single") != (self.world_size == 1):
            raise ValueError(f"{self.id}: parallel single is world size 1, and world size 1 is parallel single")
        if self.parallel == "ep" and self.model != "moe":
            raise ValueError(f"{self.id}: expert parallel needs the moe model")
        if self.model == "moe" and self.parallel in ("tp_sp", "fsdp_tp"):
            raise ValueError(f"{self.id}: the MoE block has a TP plan for `tp` only")
        if self.loss == "parallel" and self.plan is None:
            raise ValueError(f"{self.id}: loss parallel shards the logits over a TP dim: it needs tp, tp_sp or fsdp_tp")
        if self.parallel == "fsdp_tp" and self.world_size % TP_DEGREE_2D:
            raise ValueError(f"{self.id}: fsdp_tp needs a world size divisible by its TP degree {TP_DEGREE_2D}")
        if self.accum < 1:
            raise ValueError(f"{self.id}: accum={self.accum} microbatches")
        if self.resume != "none" and self.steps <= RESUME_AT:
            raise ValueError(f"{self.id}: a resume row needs more than {RESUME_AT} steps")
        if self.tp_degree > 1:
            self.model_args.check_tp(self.tp_degree)

    @property
    def id(self) -> str:
        parts = [self.parallel]
        if self.model != "dense":
            parts.append(self.model)
        if self.compile == "none":
            parts.append("eager")
        else:
            parts.append(f"compile_{self.compile}" + ("" if self.backend == "inductor" else f"_{self.backend}"))
        if self.ac != "none":
            parts.append("ac_sel" if self.ac == "selective" else f"ac_{self.ac}")
        if self.float8 != "none":
            parts.append(f"f8_{self.float8}")
        if self.async_tp:
            parts.append("asynctp")
        if self.train != "full":
            parts.append(self.train)
        if self.shapes != "static":
            parts.append(self.shapes)
        if self.mp != "none":
            parts.append(f"mp_{self.mp}")
        if self.accum != 1:
            parts.append(f"ga{self.accum}")
        if self.loss != "plain":
            parts.append("loss_parallel")
        if self.eval != "none":
            parts.append(f"eval_{self.eval}")
        if self.resume != "none":
            parts.append(f"dcp_to_{self.resume}")
        if self.world_size != 2:
            parts.append(f"ws{self.world_size}")
        if self.optim != "sgd":
            parts.append(self.optim)
        return "-".join(parts)

    @property
    def plan(self) -> str | None:
        """The TP plan applied on the TP mesh dim (None: no TP)."""
        return {"tp": "tp", "tp_sp": "tp_sp", "fsdp_tp": "tp_sp"}.get(self.parallel)

    @property
    def fsdp(self) -> bool:
        return self.parallel in ("fsdp", "fsdp_tp")

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
    def mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """(shape, dim names) of the device mesh this row trains on."""
        if self.parallel == "fsdp_tp":
            return (self.dp_degree, self.tp_degree), ("dp_shard", "tp")
        return (self.world_size,), ("tp",) if self.plan else ("dp_shard",)

    @property
    def model_args(self) -> ModelArgs:
        if self.model == "moe":
            return MOE_MODEL
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
        """Markers (name, args, why) this scenario needs on `device_type`.

        Names are the harness's requires_accelerator / requires_sm, or `skip` for what the
        accelerator's process-group backend cannot do at all.
        """
        from .devices import suite_device

        device = suite_device(device_type)
        needs: list[tuple[str, tuple, str]] = []
        if self.async_tp:
            needs.append(("requires_accelerator", ("cuda",), "async TP fuses collectives over CUDA symmetric memory"))
            needs.append(("requires_sm", (90,), "symmetric-memory async TP kernels need SM90"))
        if self.float8 != "none" and device.float8_min_sm:
            needs.append(("requires_sm", (device.float8_min_sm[self.float8],), f"float8 {self.float8} _scaled_mm kernels"))
        if self.float8_all_gather and not device.float8_collectives:
            what = "FSDP2's float8 all-gather of the weights" if self.fsdp else \
                "tensorwise Float8 with sequence parallel all-gathers float8 tensors"
            needs.append(("skip", (), f"{what}, which the {device_type} process-group backend cannot carry"))
        return needs

    def in_tier(self, tier: str) -> bool:
        return TIERS.index(self.tier) <= TIERS.index(tier)


def _row(plan, compile, backend, ac, float8, async_tp, ws, optim, tier, **more) -> Scenario:
    return Scenario(plan, compile, "none" if backend == "-" else backend, ac, float8, async_tp == "async", ws, optim,
                    tier, **more)


def _new(parallel: str, compile: str = "none", backend: str = "-", *, ac: str = "none", float8: str = "none",
         ws: int = 2, optim: str = "sgd", tier: str = "nightly", **more) -> Scenario:
    """A row of the newer columns, written by keyword (the defaults are the id's defaults)."""
    return _row(parallel, compile, backend, ac, float8, "-", ws, optim, tier, **more)


# fmt: off
#       plan     compile  backend      ac           float8                async    ws optim    tier
TABLE = [_row(*r) for r in (
    # eager: the TP plans themselves, AC and Float8 without a compiler in the way
    ("tp",    "none",  "-",         "none",      "none",               "-",     2, "sgd",   "pr"),
    ("tp_sp", "none",  "-",         "none",      "none",               "-",     2, "sgd",   "pr"),
    ("tp",    "none",  "-",         "none",      "none",               "-",     2, "adamw", "pr"),
    ("tp_sp", "none",  "-",         "full",      "none",               "-",     2, "sgd",   "pr"),
    ("tp_sp", "none",  "-",         "selective", "none",               "-",     2, "sgd",   "pr"),
    ("tp",    "none",  "-",         "none",      "none",               "-",     4, "sgd",   "nightly"),
    ("tp_sp", "none",  "-",         "none",      "none",               "-",     4, "adamw", "nightly"),
    ("tp",    "none",  "-",         "none",      "tensorwise",         "-",     2, "sgd",   "pr"),
    ("tp",    "none",  "-",         "none",      "rowwise",            "-",     2, "sgd",   "pr"),
    ("tp_sp", "none",  "-",         "none",      "tensorwise",         "-",     2, "sgd",   "nightly"),
    ("tp_sp", "none",  "-",         "none",      "rowwise",            "-",     2, "sgd",   "pr"),
    ("tp_sp", "none",  "-",         "none",      "rowwise_with_gw_hp", "-",     2, "sgd",   "nightly"),
    ("tp_sp", "none",  "-",         "full",      "rowwise",            "-",     2, "sgd",   "nightly"),
    ("tp_sp", "none",  "-",         "selective", "tensorwise",         "-",     2, "sgd",   "nightly"),
    # Dynamo and AOTAutograd without inductor: tracing, functional collectives, tangents
    ("tp",    "block", "eager",     "none",      "none",               "-",     2, "sgd",   "pr"),
    ("tp",    "model", "aot_eager", "none",      "none",               "-",     2, "sgd",   "pr"),
    ("tp_sp", "block", "aot_eager", "none",      "none",               "-",     2, "sgd",   "pr"),
    ("tp_sp", "model", "aot_eager", "full",      "none",               "-",     2, "sgd",   "nightly"),
    ("tp_sp", "block", "aot_eager", "selective", "none",               "-",     2, "sgd",   "nightly"),
    ("tp_sp", "model", "eager",     "full",      "none",               "-",     2, "sgd",   "nightly"),
    ("tp_sp", "block", "aot_eager", "none",      "tensorwise",         "-",     2, "sgd",   "nightly"),
    ("tp_sp", "model", "aot_eager", "none",      "rowwise",            "-",     2, "sgd",   "nightly"),
    ("tp_sp", "block", "aot_eager", "none",      "none",               "-",     4, "sgd",   "nightly"),
    # inductor: what production training runs
    ("tp",    "model", "inductor",  "none",      "none",               "-",     2, "sgd",   "pr"),
    ("tp",    "block", "inductor",  "none",      "none",               "-",     2, "sgd",   "nightly"),
    ("tp_sp", "model", "inductor",  "none",      "none",               "-",     2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "none",      "none",               "-",     2, "sgd",   "pr"),
    ("tp_sp", "block", "inductor",  "full",      "none",               "-",     2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "selective", "none",               "-",     2, "sgd",   "nightly"),
    ("tp_sp", "model", "inductor",  "full",      "none",               "-",     2, "sgd",   "nightly"),
    ("tp",    "model", "inductor",  "none",      "none",               "-",     2, "adamw", "nightly"),
    ("tp_sp", "block", "inductor",  "none",      "tensorwise",         "-",     2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "none",      "rowwise",            "-",     2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "none",      "rowwise_with_gw_hp", "-",     2, "sgd",   "nightly"),
    ("tp_sp", "model", "inductor",  "none",      "tensorwise",         "-",     2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "full",      "rowwise",            "-",     2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "selective", "tensorwise",         "-",     2, "sgd",   "nightly"),
    ("tp",    "block", "inductor",  "none",      "rowwise",            "-",     2, "sgd",   "nightly"),
    # async TP (CUDA SM90): inductor's micro-pipeline pass must fuse collective + matmul
    ("tp_sp", "block", "inductor",  "none",      "none",               "async", 2, "sgd",   "nightly"),
    ("tp_sp", "model", "inductor",  "none",      "none",               "async", 2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "full",      "none",               "async", 2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "selective", "none",               "async", 2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "none",      "tensorwise",         "async", 2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "none",      "rowwise",            "async", 2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "none",      "rowwise_with_gw_hp", "async", 2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "full",      "tensorwise",         "async", 2, "sgd",   "nightly"),
    ("tp_sp", "block", "inductor",  "full",      "rowwise",            "async", 2, "sgd",   "nightly"),
    ("tp_sp", "model", "inductor",  "none",      "rowwise",            "async", 2, "adamw", "nightly"),
)]
# fmt: on

# The rows of the newer columns (parallel beyond TP, train, shapes, model, mp, accum, eval,
# loss, resume), by keyword. 4-rank rows are what fsdp_tp is (dp_shard 2 x tp 2).
NEW_TABLE = [
    # FSDP2 alone: fully_shard per block + root, torchtitan's mixed precision and accumulation
    _new("fsdp", tier="pr"),
    _new("fsdp", mp="bf16"),
    _new("fsdp", mp="bf16", accum=2),
    _new("fsdp", accum=2, optim="adamw"),
    _new("fsdp", ac="full"),
    _new("fsdp", float8="rowwise"),
    _new("fsdp", "block", "inductor"),
    _new("fsdp", "block", "aot_eager", ac="selective"),
    _new("fsdp", "model", "aot_eager"),
    _new("fsdp", "block", "inductor", float8="tensorwise"),
    # 2-D: FSDP2 outside sequence-parallel TP (dp_shard 2 x tp 2), torchtitan's default
    _new("fsdp_tp", ws=4, tier="pr"),
    _new("fsdp_tp", ws=4, mp="bf16", accum=2),
    _new("fsdp_tp", "block", "inductor", ws=4),
    _new("fsdp_tp", "block", "inductor", ws=4, mp="bf16"),
    _new("fsdp_tp", "block", "aot_eager", ws=4, ac="full"),
    _new("fsdp_tp", "model", "aot_eager", ws=4),
    _new("fsdp_tp", ws=4, float8="rowwise"),
    _new("fsdp_tp", "block", "inductor", ws=4, float8="tensorwise", ac="full"),
    # frozen weights, LoRA-style adapters on the column-parallel linears
    _new("tp", train="frozen", tier="pr"),
    _new("tp_sp", train="frozen"),
    _new("tp", "block", "aot_eager", train="frozen"),
    _new("tp_sp", "block", "inductor", train="frozen"),
    _new("tp_sp", "model", "inductor", train="frozen"),
    _new("fsdp_tp", ws=4, train="frozen"),
    # a new sequence length every step: numbers and the recompile budget
    _new("tp_sp", shapes="varlen", tier="pr"),
    _new("tp", "model", "inductor", shapes="varlen"),
    _new("tp_sp", "model", "aot_eager", shapes="varlen"),
    _new("tp_sp", "block", "inductor", shapes="varlen"),
    _new("fsdp", "block", "aot_eager", shapes="varlen"),
    # an eval forward of the trained, compiled model under no_grad / inference_mode
    _new("tp", "model", "inductor", eval="no_grad"),
    _new("tp_sp", "block", "inductor", eval="inference"),
    _new("tp_sp", "model", "aot_eager", eval="inference"),
    _new("fsdp_tp", "block", "inductor", ws=4, eval="no_grad"),
    # mixture of experts: experts TP-sharded, FSDP-sharded, or expert-parallel (all-to-all)
    _new("tp", model="moe", tier="pr"),
    _new("tp", "block", "aot_eager", model="moe"),
    _new("tp", "block", "inductor", model="moe"),
    _new("tp", model="moe", ac="full"),
    _new("fsdp", model="moe", mp="bf16"),
    _new("fsdp", "block", "inductor", model="moe", accum=2),
    _new("ep", model="moe"),
    _new("ep", model="moe", ws=4, accum=2),
    # distributed checkpoint: save under one layout, load under another, train on
    _new("tp_sp", resume="fsdp", tier="pr"),
    _new("tp_sp", resume="single"),
    _new("fsdp", resume="tp_sp", optim="adamw"),
    _new("fsdp_tp", ws=4, resume="tp_sp"),
    _new("fsdp_tp", ws=4, resume="fsdp", optim="adamw"),
    # loss parallel: vocab-parallel cross entropy over Shard(-1) logits
    _new("tp", loss="parallel"),
    _new("tp_sp", loss="parallel", tier="pr"),
    _new("tp_sp", "model", "inductor", loss="parallel"),
    _new("fsdp_tp", ws=4, loss="parallel"),
]
TABLE = TABLE + NEW_TABLE

SCENARIOS: dict[str, Scenario] = {}
for _s in TABLE:
    if _s.id in SCENARIOS:
        raise ValueError(f"two scenario rows share the id {_s.id!r}")
    SCENARIOS[_s.id] = _s


@dataclass(frozen=True)
class Tolerance:
    """How close a TP run must stay to its single-process reference.

    loss: |run - ref| <= loss_atol + loss_rtol * |ref| at every step.
    grads, per parameter and step: a signal-to-quantization-noise ratio of at least
    grad_min_sqnr dB (torchao's measure, a norm-wise error), and when grad_max_rel is set
    also max|run - ref| <= grad_max_rel * max|ref| (no single element far off).
    """

    loss_rtol: float
    loss_atol: float
    grad_min_sqnr: float
    grad_max_rel: float | None = None


# Why these numbers (CPU fp32 measured with torch 2.13.0 / torchao 0.18.0 over 3 steps; the
# bf16 rows are first estimates until the 2xH200 report in reports/gpu/ confirms them):
# fp32 without Float8: TP only reorders sums (all-reduce, sharded matmul K): measured
#   gradient SQNR >= 99 dB and max error <= 7e-5 of the tensor's max (AdamW amplifies
#   noise in near-zero gradients), loss identical to 1e-7. 60 dB / 1e-3 leave headroom and
#   still fail a missing reduction (O(1) error) or a dropped gradient (0 dB).
# Float8 is judged against the same recipe on one process (torchao's practice):
#   tensorwise: scales come from global amaxes. On CPU TP matched to >= 99 dB, but on
#   2xH200 (torch 2.11, torchtitan's llama3, fp32) TP=2 vs TP=1 was 24.7-39 dB in eager,
#   compiled and async-TP runs alike, loss within 3e-7: the reduce-scatter sums partial
#   products in another order, activations move by ulps, so do their amaxes (scales 4e-7
#   apart from the second Float8 linear on, tools/diag_titan_scales.py), and every element
#   near an fp8 rounding boundary flips by one fp8 step (6-12%). Require 20 dB, as a
#   row mix-up (~0 dB), a missing reduction or a dropped gradient (< 10 dB) stay far below.
#   rowwise / rowwise_with_gw_hp: the rowwise-parallel layers scale each row over their
#   local K shard, so quantization differs from one process and the difference compounds
#   over layers and steps: measured >= 21.5 dB, loss within 2.2e-4 (require 15 dB, 2e-3).
#   For scale: float8 vs high precision is ~25 dB; a missing reduction or dropped
#   gradient is below 10 dB.
# bf16: both sides round to 8 mantissa bits at different points (require 25 dB, 1e-2).
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("float32", "none"): Tolerance(loss_rtol=1e-5, loss_atol=1e-6, grad_min_sqnr=60.0, grad_max_rel=1e-3),
    ("float32", "tensorwise"): Tolerance(loss_rtol=1e-4, loss_atol=1e-5, grad_min_sqnr=20.0),
    ("float32", "rowwise"): Tolerance(loss_rtol=2e-3, loss_atol=1e-4, grad_min_sqnr=15.0),
    ("float32", "rowwise_with_gw_hp"): Tolerance(loss_rtol=2e-3, loss_atol=1e-4, grad_min_sqnr=15.0),
    ("bfloat16", "none"): Tolerance(loss_rtol=1e-2, loss_atol=1e-3, grad_min_sqnr=25.0),
    ("bfloat16", "tensorwise"): Tolerance(loss_rtol=2e-2, loss_atol=1e-3, grad_min_sqnr=15.0),
    ("bfloat16", "rowwise"): Tolerance(loss_rtol=2e-2, loss_atol=1e-3, grad_min_sqnr=15.0),
    ("bfloat16", "rowwise_with_gw_hp"): Tolerance(loss_rtol=2e-2, loss_atol=1e-3, grad_min_sqnr=15.0),
}


def tolerance(dtype: str, float8: str) -> Tolerance:
    return TOLERANCES[(dtype, float8)]


def select(tier: str) -> list[Scenario]:
    """The scenarios a run of `tier` executes (a tier includes every earlier tier)."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; known: {', '.join(TIERS)}")
    return [s for s in TABLE if s.in_tier(tier)]
