"""The scenario table: every TP x compile x AC x Float8 x async-TP combination we run.

Declared as data, one row per scenario, in the spirit of torchtitan's integration-test
definitions; one runner (suites/training.py) executes any row, and the checks
(suites/checks.py) judge it by numbers and graphs. A scenario's pytest id is built from
its columns, e.g. `tp_sp-compile_block-ac_full-f8_rowwise-asynctp`: default values
(inductor backend, no AC, no Float8, world size 2, SGD) are left out of the id.

Columns:
  plan      tp | tp_sp                       (torchtitan's llama3 plan, sequence parallel or not)
  compile   none | model | block             (always fullgraph=True)
  backend   eager | aot_eager | inductor     (`-` when compile is none)
  ac        none | full | selective          (checkpoint_wrapper; selective = torchtitan's op policy)
  float8    none | tensorwise | rowwise | rowwise_with_gw_hp
  async_tp  micro-pipeline TP over symmetric memory (CUDA + inductor + tp_sp only)
  ws        world size (= TP degree)
  optim     sgd | adamw
  tier      pr (CPU subset for every PR, <= 10 min on 2 cores) | nightly (the rest)
"""

from __future__ import annotations

from dataclasses import dataclass

from .model_args import ModelArgs

PLANS = ("tp", "tp_sp")
COMPILES = ("none", "model", "block")
BACKENDS = ("none", "eager", "aot_eager", "inductor")
ACS = ("none", "full", "selective")
FLOAT8S = ("none", "tensorwise", "rowwise", "rowwise_with_gw_hp")
OPTIMS = ("sgd", "adamw")
TIERS = ("pr", "nightly", "release")
"""Ordered: a run of tier T selects every scenario whose tier is T or earlier."""

MODEL = ModelArgs()
STEPS = 3
BATCH = 2
SEED = 20251130
LR = {"sgd": 0.1, "adamw": 1e-3}


@dataclass(frozen=True)
class Scenario:
    plan: str
    compile: str
    backend: str
    ac: str
    float8: str
    async_tp: bool
    world_size: int
    optim: str
    tier: str

    def __post_init__(self) -> None:
        for value, allowed, column in (
            (self.plan, PLANS, "plan"),
            (self.compile, COMPILES, "compile"),
            (self.backend, BACKENDS, "backend"),
            (self.ac, ACS, "ac"),
            (self.float8, FLOAT8S, "float8"),
            (self.optim, OPTIMS, "optim"),
            (self.tier, TIERS, "tier"),
        ):
            if value not in allowed:
                raise ValueError(f"scenario column {column}={value!r}; allowed: {', '.join(allowed)}")
        if (self.compile == "none") != (self.backend == "none"):
            raise ValueError(f"scenario compile={self.compile!r} with backend={self.backend!r}: "
                             "a backend is named exactly when something is compiled")
        if self.async_tp and (self.plan != "tp_sp" or self.compile == "none" or self.backend != "inductor"):
            raise ValueError(f"{self.id}: async TP is an inductor pass over sequence-parallel TP: "
                             "it needs plan tp_sp, compile model|block and backend inductor")
        MODEL.check_tp(self.world_size)

    @property
    def id(self) -> str:
        parts = [self.plan]
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
        if self.world_size != 2:
            parts.append(f"ws{self.world_size}")
        if self.optim != "sgd":
            parts.append(self.optim)
        return "-".join(parts)

    @property
    def compiled(self) -> bool:
        return self.compile != "none"

    @property
    def uses_inductor(self) -> bool:
        return self.compiled and self.backend == "inductor"

    @property
    def float8_all_gather(self) -> bool:
        """Whether float8 bytes cross the wire: torchao's Float8 TP styles all-gather the
        float8 activation under sequence parallelism."""
        return self.float8 == "tensorwise" and self.plan == "tp_sp"

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
            needs.append(("skip", (), f"tensorwise Float8 with sequence parallel all-gathers float8 tensors, "
                                      f"which the {device_type} process-group backend cannot carry"))
        return needs

    def in_tier(self, tier: str) -> bool:
        return TIERS.index(self.tier) <= TIERS.index(tier)


def _row(plan, compile, backend, ac, float8, async_tp, ws, optim, tier) -> Scenario:
    return Scenario(plan, compile, "none" if backend == "-" else backend, ac, float8, async_tp == "async", ws, optim, tier)


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
