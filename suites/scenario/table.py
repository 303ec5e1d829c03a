"""The scenario table: every parallelism x compile x AC x Float8 x training-step combination we run.

TABLE: the rows, in one notation, `row(parallel, compile, backend, column=value, ...)`;
the columns, their rules and the Scenario record are declared once in
suites/scenario/record.py (re-exported here: this module is the table's one public face).
One runner (training.py) executes any row; the checks (checks.py) judge it by numbers and
graphs. Rows a user trains beyond the base table (the training step's columns crossed with
the parallelisms users combine them with) are built in suites/scenario/rows.py.
"""

from __future__ import annotations

from .columns import REQUIRED, Column, Rule, ScenarioError  # noqa: F401  (the table's public face)
from .rows import (crossing_rows, ddp_rows, fp16_rows, grad_sync_rows, layout_rows, meta_load_rows,
                            optimizer_rows, tie_rows, training_step_rows, uneven_rows)
from .record import (  # noqa: F401
    BATCH, COLUMN, COLUMNS, DDP_BUCKET_MB, DDP_LAYOUTS, LORA_MODEL, LR, MAX_VARLEN_GRAPHS_PER_REGION, MODEL, MOE_MODEL, PP_MODEL, RESUME_AT,
    RULES, SEED, STEPS, TIERS, TP_DEGREE_2D, VARLEN_SEQ, Scenario, row,
)


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
    row("tp", train="lora", tier="pr"),
    row("tp_sp", train="lora"),
    row("tp", "block", "aot_eager", train="lora"),
    row("tp_sp", "block", "inductor", train="lora"),
    row("tp_sp", "model", "inductor", train="lora"),
    row("fsdp_tp", train="lora", world_size=4),
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
    # FSDP2 explicit prefetching (torchtitan's apply_fsdp under EP): each block issues the next one's
    # all-gather (forward) and the previous one's (backward); the numbers must not change, the
    # all-gathers must be the same ones, issued a block earlier
    row("fsdp", prefetch="explicit"),
    row("fsdp", mp="bf16", accum=2, prefetch="explicit"),
    row("fsdp", accum=2, grad_sync="last", prefetch="explicit"),
    row("fsdp", reshard="true", prefetch="explicit", optim="adamw"),
    row("fsdp", offload=True, prefetch="explicit"),
    row("fsdp", tie=True, prefetch="explicit"),
    row("fsdp", "block", "inductor", prefetch="explicit"),
    row("hsdp", world_size=4, prefetch="explicit"),
    row("fsdp_tp", world_size=4, prefetch="explicit"),
]
# fmt: on


TABLE += (training_step_rows() + crossing_rows() + layout_rows() + optimizer_rows() + grad_sync_rows()
          + tie_rows() + uneven_rows() + ddp_rows() + meta_load_rows() + fp16_rows())

SCENARIOS: dict[str, Scenario] = {}
for _s in TABLE:
    if _s.id in SCENARIOS:
        raise ScenarioError(f"two scenario rows share the id {_s.id!r}")
    SCENARIOS[_s.id] = _s
