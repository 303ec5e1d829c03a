"""The training step's rows: each column a user configures in a torchtitan step (clipping,
the loss, pipeline schedules, HSDP, FSDP2's offload and reshard settings, LR schedules,
async checkpoints, fine-tuning's frozen parts, MoE routing edges, context parallel) crossed
with the parallelisms, compile modes, mixed precision and accumulation users combine it
with. Bugs live in those combinations (issue: suites that find bugs they were not written
for), so these rows are crossings, not corners; every one is in the nightly tier unless it
is cheap and catches a class nothing else in the pr tier does.
"""

from __future__ import annotations

from .record import Scenario, row


def training_step_rows() -> list[Scenario]:
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
        # clipping by the largest |gradient| (norm_type=inf): DTensor's Partial max reductions
        row("fsdp", clip="inf"),
        row("fsdp", mp="bf16", accum=2, clip="inf"),
        row("fsdp", "block", "inductor", clip="inf", optim="adamw"),
        row("fsdp_tp", world_size=4, clip="inf"),
        row("fsdp_tp", "block", "aot_eager", world_size=4, mp="bf16", clip="inf"),
        row("tp", clip="inf"),
        row("tp_sp", clip="inf"),
        row("tp_sp", "block", "inductor", clip="inf"),
        row("hsdp", world_size=4, clip="inf"),
        row("ep", model="moe", clip="inf"),
        row("ep", model="moe", world_size=4, accum=2, clip="inf"),
        row("ep_fsdp", model="moe", clip="inf"),
        row("pp", schedule="1f1b", accum=2, clip="inf"),
        row("pp", schedule="interleaved_1f1b", accum=2, clip="inf", optim="adamw"),
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
        row("tp", resume="fsdp", sched="warmup_cosine", optim="adamw"),  # the schedule resumes where it was
        # a frozen base with LoRA adapters under FSDP2
        row("fsdp", train="lora"),
        row("fsdp", "block", "inductor", train="lora"),
        row("fsdp", "model", "aot_eager", train="lora"),
        row("fsdp_tp", "block", "inductor", world_size=4, train="lora"),
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
    rows.append(row("tp", model="moe", accum=3, routing="empty_last", eval="no_grad"))  # eval routes naturally
    # pipeline parallel: every schedule, microbatches, clipping across stages, frozen parts
    for schedule in ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"):
        rows += [row("pp", schedule=schedule, accum=2), row("pp", schedule=schedule, accum=4, clip="mesh")]
    rows += [row("pp", schedule="1f1b", accum=2, optim="adamw", sched="warmup_cosine"),
             row("pp", schedule="interleaved_1f1b", accum=2, train="frozen_embed"),
             row("pp", schedule="gpipe", accum=2, loss="z_loss")]
    return rows


def crossing_rows() -> list[Scenario]:
    """Each training-step column crossed with what users turn on beside it (issue #26's
    crossings): clipping x layout x (eager, compiled, mixed precision, accumulation); the
    loss values x (plain, loss parallel, compiled) x (SP, FSDP2 x TP); HSDP and CPU offload
    x (mixed precision, compile, clipping, accumulation); fine-tuning's frozen parts x
    (per-block, whole-model compile) x SP x FSDP2 x mixed precision; MoE routing edges on
    4 ranks; warmup + cosine x clipping x mixed precision. Compiled crossings use
    aot_eager where inductor adds nothing the base table's inductor rows do not already
    cover (AOTAutograd's tracing is where these columns meet the compiler), inductor
    where users' code meets inductor's own passes (mixed precision casts, the compiled loss)."""
    rows = [
        # clipping x (fsdp, fsdp_tp, ep, hsdp) x (eager, compiled, mp_bf16, ga)
        row("fsdp", accum=2, clip="foreach"),
        row("fsdp", mp="bf16", clip="mesh"),
        row("fsdp", "model", "aot_eager", clip="foreach"),
        row("fsdp", "block", "aot_eager", accum=2, clip="mesh"),
        row("fsdp", "block", "aot_eager", mp="bf16", accum=2, clip="norm"),
        row("fsdp", "block", "inductor", mp="bf16", clip="foreach"),
        row("fsdp_tp", world_size=4, accum=2, clip="norm"),
        row("fsdp_tp", world_size=4, mp="bf16", clip="foreach"),
        row("fsdp_tp", world_size=4, mp="bf16", accum=2, clip="mesh"),
        row("fsdp_tp", "block", "aot_eager", world_size=4, clip="mesh"),
        row("fsdp_tp", "model", "aot_eager", world_size=4, clip="norm"),
        row("tp_sp", "block", "aot_eager", clip="norm"),
        row("ep", model="moe", accum=2, clip="mesh"),
        row("ep", model="moe", optim="adamw", clip="mesh"),
        # HSDP x (mp_bf16, compile, clip, ga, offload)
        row("hsdp", world_size=4, mp="bf16", clip="norm"),
        row("hsdp", world_size=4, accum=2, clip="foreach"),
        row("hsdp", world_size=4, mp="bf16", accum=2, clip="mesh"),
        row("hsdp", "block", "aot_eager", world_size=4, mp="bf16"),
        row("hsdp", "block", "aot_eager", world_size=4, clip="norm"),
        row("hsdp", "model", "aot_eager", world_size=4),
        row("hsdp", world_size=4, offload=True, mp="bf16"),
        row("hsdp", world_size=4, offload=True, accum=2),
        # FSDP2 CPU offload x (mp, clip, ga, compile)
        row("fsdp", offload=True, accum=2),
        row("fsdp", offload=True, mp="bf16", accum=2),
        row("fsdp", offload=True, mp="bf16", clip="norm"),
        row("fsdp", "block", "aot_eager", offload=True),
        row("fsdp_tp", world_size=4, offload=True, mp="bf16"),
        row("fsdp_tp", world_size=4, offload=True, clip="norm"),
        # warmup + cosine with two parameter groups x clipping x mixed precision
        row("fsdp", mp="bf16", sched="warmup_cosine", optim="adamw", clip="norm"),
        row("fsdp", mp="bf16", accum=2, sched="warmup_cosine", clip="foreach"),
        row("fsdp", "block", "aot_eager", mp="bf16", sched="warmup_cosine", optim="adamw", clip="norm"),
        row("fsdp_tp", world_size=4, mp="bf16", sched="warmup_cosine", optim="adamw", clip="norm"),
        row("hsdp", world_size=4, mp="bf16", sched="warmup_cosine", optim="adamw", clip="norm"),
        row("ep", model="moe", sched="warmup_cosine", optim="adamw", clip="mesh"),
        # cross entropy compiled under FSDP2 x TP, with and without loss parallel
        row("fsdp_tp", "block", "aot_eager", world_size=4, loss_compile=True),
        row("fsdp_tp", "block", "aot_eager", world_size=4, loss_compile=True, loss_parallel=True),
    ]
    # the loss values x (plain, loss parallel, compiled) x (tp_sp, fsdp_tp)
    for loss in ("smooth_ce", "soft_ce", "z_loss"):
        rows += [
            row("tp_sp", loss=loss),
            row("fsdp_tp", world_size=4, loss=loss),
            row("tp_sp", "model", "aot_eager", loss=loss, loss_compile=True),
            row("fsdp_tp", "block", "aot_eager", world_size=4, loss=loss, loss_compile=True),
            row("fsdp_tp", "block", "aot_eager", world_size=4, loss=loss, loss_compile=True, loss_parallel=True),
        ]
    # fine-tuning's frozen parts x (compile_block, compile_model) x SP x FSDP2 (x mixed precision)
    for train in ("lora", "frozen_embed", "frozen_norms"):
        rows += [
            row("fsdp_tp", "model", "aot_eager", world_size=4, train=train),
            row("fsdp_tp", "block", "aot_eager", world_size=4, mp="bf16", train=train),
            row("fsdp", "block", "aot_eager", mp="bf16", train=train),
        ]
    rows += [row("tp_sp", "model", "aot_eager", train="lora"),
             row("tp_sp", "block", "aot_eager", train="lora"),
             row("hsdp", "block", "aot_eager", world_size=4, train="frozen_norms")]
    # MoE routing edges on 4 ranks (FSDP2 and EP, accumulation), in float32 and under mixed
    # precision (bf16 moves a near-tie token in most steps: checks.compare_routing lets
    # near-ties move, measured 2026-12-02, suites/judges/tolerances.py)
    for edge in ("empty_first", "empty_middle", "empty_last", "one_expert"):
        rows += [row("fsdp", model="moe", world_size=4, accum=2, routing=edge),
                 row("fsdp", model="moe", world_size=4, accum=2, mp="bf16", routing=edge)]
        if edge != "empty_middle":  # ep ws4 empty_middle is a row of training_step_rows
            rows.append(row("ep", model="moe", world_size=4, accum=2, routing=edge))
    rows += [row("ep_fsdp", model="moe", world_size=4, accum=2, mp="bf16", routing=edge)
             for edge in ("empty_last", "one_expert")]
    rows += [row("fsdp", model="moe", accum=2, mp="bf16", clip="norm", routing="empty_last"),
             row("fsdp", model="moe", accum=3, routing="empty_middle", sched="warmup_cosine", optim="adamw")]
    return rows


def layout_rows() -> list[Scenario]:
    """torchtitan's multi-dimensional layouts: PP x FSDP2 and PP x TP on a 2 x 2 mesh (pp
    outermost), EP as torchtitan lays it out (dense weights FSDP2 on every rank, experts on
    an ep mesh with FSDP2 over the ranks owning the same experts: gradients on two meshes,
    clipped across both), and context parallel (CUDA: see devices.CP_NOT_ON_CPU)."""
    rows = []
    for schedule in ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"):
        rows += [row("pp_fsdp", schedule=schedule, accum=2, world_size=4),
                 row("pp_tp", schedule=schedule, accum=2, world_size=4)]
    rows += [
        row("pp_fsdp", schedule="1f1b", accum=4, clip="mesh", world_size=4),
        row("pp_fsdp", schedule="gpipe", accum=2, mp="bf16", world_size=4),
        row("pp_fsdp", schedule="interleaved_1f1b", accum=2, mp="bf16", clip="mesh", world_size=4),
        row("pp_fsdp", schedule="1f1b", accum=2, optim="adamw", sched="warmup_cosine", clip="mesh", world_size=4),
        row("pp_tp", schedule="1f1b", accum=4, clip="mesh", world_size=4),
        row("pp_tp", schedule="gpipe", accum=2, loss="smooth_ce", world_size=4),
        row("pp_tp", schedule="interleaved_1f1b", accum=2, train="frozen_embed", world_size=4),
        # EP laid out as torchtitan does
        row("ep_fsdp", model="moe"),
        row("ep_fsdp", model="moe", clip="mesh"),
        row("ep_fsdp", model="moe", mp="bf16", accum=2, clip="mesh"),
        row("ep_fsdp", model="moe", world_size=4),
        row("ep_fsdp", model="moe", world_size=4, clip="mesh"),
        row("ep_fsdp", model="moe", world_size=4, mp="bf16", clip="mesh"),  # 8 bf16 microbatches: routing budget
        row("ep_fsdp", model="moe", world_size=4, accum=2, routing="empty_middle", clip="mesh"),
        row("ep_fsdp", model="moe", world_size=4, optim="adamw", sched="warmup_cosine", clip="mesh"),
        # plain clip_grad_norm_ (and its foreach form) over gradients on two meshes: a RULE forbade it as
        # "fails upstream"; on torch 2.13.0 (CPU, fixes on) both pass, so they are rows that judge it
        row("ep_fsdp", model="moe", world_size=4, clip="norm"),
        row("ep_fsdp", model="moe", world_size=4, clip="foreach"),
        # context parallel: ring attention over the sequence (CUDA rows: CPU attention cannot shard)
        row("cp"),
        row("cp", accum=2, clip="norm"),
        row("cp", "block", "inductor"),
        row("cp", "model", "inductor", clip="norm"),
        row("cp", optim="adamw", sched="warmup_cosine", clip="norm"),
        row("cp", loss="z_loss"),
    ]
    return rows


def ddp_rows() -> list[Scenario]:
    """Data parallel by replication, the most used distributed training path: classic
    DistributedDataParallel (its C++ reducer, accumulation with and without no_sync
    (grad_sync), static_graph under AC,
    find_unused_parameters for MoE, the bf16 compression hook, autocast mixed precision)
    and composable replicate as torchtitan's apply_ddp applies it. Compiled, both are
    Dynamo's DDPOptimizer, which splits a graph at DDP's bucket boundaries (DDP_BUCKET_MB:
    a whole-model compile splits in two), a frequent bug source."""
    rows = []
    for parallel in ("ddp", "replicate"):
        rows += [
            row(parallel, tier="pr" if parallel == "ddp" else "nightly"),
            row(parallel, accum=2),
            row(parallel, accum=2, grad_sync="last"),
            row(parallel, "model", "aot_eager"),
            row(parallel, "model", "inductor"),
            row(parallel, "block", "inductor"),
            row(parallel, "block", "aot_eager", ac="full"),
            row(parallel, "model", "aot_eager", ac="selective"),
            row(parallel, ac="full", accum=2, grad_sync="last"),
            row(parallel, "model", "aot_eager", accum=2, grad_sync="last"),
            row(parallel, train="frozen_embed"),
            row(parallel, "model", "aot_eager", train="frozen_norms"),
            row(parallel, "block", "inductor", train="lora"),
            row(parallel, clip="norm", optim="adamw", sched="warmup_cosine"),
            row(parallel, "model", "inductor", clip="foreach", accum=2, grad_sync="last"),
            row(parallel, loss="z_loss", zero_grad="zeros", accum=2, grad_sync="last"),
            row(parallel, mp="bf16"),
            row(parallel, world_size=4, accum=2, grad_sync="last"),
            row(parallel, "model", "aot_eager", world_size=4),
        ]
    rows += [
        row("ddp", loss="smooth_ce", clip="foreach"),
        row("ddp", "block", "aot_eager", loss="soft_ce", loss_compile=True),
        row("ddp", ac="full", accum=2),  # static_graph accumulation that syncs every microbatch
        row("ddp", model="moe", accum=2, grad_sync="last"),
        row("ddp", "model", "aot_eager", mp="bf16", accum=2, grad_sync="last"),
        row("replicate", train="lora", zero_grad="zeros"),
        row("replicate", "model", "inductor", optim="adamw", sched="warmup_cosine"),
        # the bf16 compression communication hook: gradients all-reduced in bf16
        row("ddp", ddp_hook="bf16"),
        row("ddp", ddp_hook="bf16", accum=2, grad_sync="last", clip="norm"),
        row("ddp", "model", "aot_eager", ddp_hook="bf16"),
        row("ddp", "block", "inductor", ddp_hook="bf16", optim="adamw"),
        row("ddp", world_size=4, ddp_hook="bf16"),
    ]
    return rows
def optimizer_rows() -> list[Scenario]:
    """torch.optim's multi-tensor (foreach, the CUDA default) and fused kernels (torchtitan's
    AdamW default) over DTensor parameters and gradients, crossed with the layouts users
    train them under (FSDP2, FSDP2 x TP, TP / SP, HSDP, EP on its own mesh, PP), mixed
    precision, accumulation, clipping, compiled blocks and an LR schedule with two
    parameter groups. The reference steps with the per-parameter loop; on CPU every other
    row does too (torch picks foreach / fused for CUDA tensors only)."""
    return [
        row("fsdp", optim="adamw", opt_impl="fused"),
        row("fsdp", opt_impl="fused"),
        row("fsdp", optim="adamw", opt_impl="fused", mp="bf16", accum=2),
        row("fsdp", "block", "inductor", optim="adamw", opt_impl="fused", clip="norm"),
        row("fsdp", "block", "aot_eager", optim="adamw", opt_impl="foreach"),
        row("fsdp", optim="adamw", opt_impl="foreach", accum=2),
        row("fsdp", opt_impl="foreach", clip="foreach"),
        row("fsdp_tp", world_size=4, optim="adamw", opt_impl="fused"),
        row("fsdp_tp", "block", "aot_eager", world_size=4, optim="adamw", opt_impl="fused", sched="warmup_cosine",
            clip="norm"),
        row("fsdp_tp", world_size=4, optim="adamw", opt_impl="foreach", mp="bf16"),
        row("tp", optim="adamw", opt_impl="fused"),
        row("tp", opt_impl="foreach"),
        row("tp_sp", "block", "inductor", optim="adamw", opt_impl="fused"),
        row("tp_sp", optim="adamw", opt_impl="foreach", sched="warmup_cosine"),
        row("hsdp", world_size=4, optim="adamw", opt_impl="fused", mp="bf16"),
        row("hsdp", world_size=4, opt_impl="foreach", accum=2),
        row("ep_fsdp", model="moe", optim="adamw", opt_impl="fused", clip="mesh"),
        row("ep_fsdp", model="moe", opt_impl="foreach"),
        row("pp", schedule="1f1b", accum=2, optim="adamw", opt_impl="fused"),
        row("pp", schedule="gpipe", accum=2, opt_impl="foreach"),
    ]


def grad_sync_rows() -> list[Scenario]:
    """FSDP2 accumulation that reduces gradients once per step (set_requires_gradient_sync
    False for every microbatch but the last, as HF accelerate and Lightning accumulate),
    crossed with mixed precision, HSDP, FSDP2 x TP, CPU offload, compiled blocks, clipping
    and gradients kept as zero tensors; the numbers must equal the reference's and the last
    step must reduce-scatter once per FSDP2 unit."""
    return [
        row("fsdp", accum=2, grad_sync="last"),
        row("fsdp", accum=4, grad_sync="last", optim="adamw"),
        row("fsdp", mp="bf16", accum=2, grad_sync="last"),
        row("fsdp", mp="bf16", accum=3, grad_sync="last", optim="adamw"),
        row("hsdp", world_size=4, accum=2, grad_sync="last"),
        row("hsdp", world_size=4, mp="bf16", accum=2, grad_sync="last"),
        row("fsdp_tp", world_size=4, accum=2, grad_sync="last"),
        row("fsdp", offload=True, accum=2, grad_sync="last"),
        row("fsdp", offload=True, mp="bf16", accum=2, grad_sync="last"),
        row("fsdp", "block", "inductor", accum=2, grad_sync="last"),
        row("fsdp", "block", "aot_eager", mp="bf16", accum=2, grad_sync="last"),
        row("fsdp", accum=2, clip="norm", grad_sync="last"),
        row("fsdp", accum=3, clip="inf", grad_sync="last"),
        row("fsdp", zero_grad="zeros", accum=2, grad_sync="last"),
        row("fsdp", zero_grad="zeros", accum=3, grad_sync="last", optim="adamw"),
        row("fsdp", zero_grad="zeros", accum=4, grad_sync="last", mp="bf16"),
    ]


def tie_rows() -> list[Scenario]:
    """A tied embedding and output (one parameter, two modules: Llama 3.2 1B/3B, small Qwen3,
    Gemma) x FSDP2's unit of that parameter (mixed precision, accumulation, HSDP), TP's two
    vocab-sharded uses of it (with and without SP, under FSDP2), compile, AC, clipping (the
    shared gradient counted once), a DCP resume under another layout, and a frozen tied
    embedding (which freezes the output with it, in the reference too)."""
    return [
        row("fsdp", tie=True),
        row("fsdp", mp="bf16", tie=True),
        row("fsdp", accum=2, tie=True),
        row("fsdp_tp", world_size=4, tie=True),
        row("tp", tie=True),
        row("tp_sp", tie=True),
        row("hsdp", world_size=4, tie=True),
        row("fsdp", "block", "inductor", tie=True),
        row("tp_sp", "block", "inductor", tie=True),
        row("fsdp", "model", "aot_eager", tie=True),
        row("tp", "model", "aot_eager", tie=True),
        row("tp_sp", ac="full", tie=True),
        row("fsdp", ac="full", tie=True),
        row("fsdp", clip="norm", tie=True),
        row("tp_sp", clip="norm", tie=True),
        row("tp_sp", resume="fsdp", tie=True),
        row("fsdp", train="frozen_embed", tie=True),
        row("tp", train="frozen_embed", tie=True),
    ]


def uneven_rows() -> list[Scenario]:
    """Dims no mesh divides (vocab 257, hidden 255: real vocabularies such as GPT-2's 50257
    or Qwen's 151936 on 3 or 6 ranks, odd hidden widths): FSDP2's padded dim-0 shards x
    mixed precision, accumulation + clipping, reshard to 2-rank groups, HSDP, offload,
    AdamW + warmup-cosine, compile; DTensor's uneven vocab / hidden shards under TP, loss
    parallel over uneven vocab shards, FSDP2 x TP; DCP resumes that reshard uneven shards
    into another layout; and the tie over uneven shards."""
    return [
        row("fsdp", shard="uneven"),
        row("fsdp", mp="bf16", shard="uneven"),
        row("fsdp", accum=2, clip="norm", shard="uneven"),
        row("fsdp", world_size=4, reshard="int2", shard="uneven"),
        row("hsdp", world_size=4, shard="uneven"),
        row("fsdp_tp", world_size=4, shard="uneven"),
        row("tp", shard="uneven"),
        row("tp", world_size=4, shard="uneven"),
        row("tp", loss_parallel=True, shard="uneven"),
        row("tp_sp", loss_parallel=True, shard="uneven"),
        row("fsdp", "block", "inductor", shard="uneven"),
        row("fsdp", resume="tp_sp", shard="uneven"),
        row("fsdp", resume="single", shard="uneven"),
        row("fsdp", offload=True, shard="uneven"),
        row("fsdp", sched="warmup_cosine", optim="adamw", shard="uneven"),
        row("ep_fsdp", model="moe", shard="uneven"),
        row("fsdp", tie=True, shard="uneven"),
        row("tp_sp", loss_parallel=True, tie=True, shard="uneven"),
    ]


def meta_load_rows() -> list[Scenario]:
    """Weights loaded as fine-tuning loads a pretrained model (init=meta_load: built on meta,
    parallelized there, to_empty, buffers made again, rank 0's full state dict broadcast
    into the shards by set_model_state_dict) x FSDP2 (mixed precision, offload, uneven
    padded shards, a tied pair under one unit, frozen parts, Float8 weights: CUDA, as FSDP2's
    float8 all-gather needs), TP with and without SP (uneven vocab shards, the tie sharded
    twice, Float8 rowwise linears), FSDP2 x TP and HSDP on 4
    ranks, per-block and whole-model compile, AC, and a DCP resume after it."""
    return [
        row("fsdp", init="meta_load"),
        row("fsdp", mp="bf16", init="meta_load"),
        row("fsdp", offload=True, init="meta_load"),
        row("fsdp", shard="uneven", init="meta_load"),
        row("fsdp", tie=True, init="meta_load"),
        row("fsdp", train="lora", init="meta_load"),
        row("fsdp", float8="tensorwise", init="meta_load"),
        row("tp", float8="rowwise", init="meta_load"),
        row("fsdp", "block", "inductor", ac="full", init="meta_load"),
        row("tp", init="meta_load"),
        row("tp", shard="uneven", init="meta_load"),
        row("tp_sp", tie=True, init="meta_load"),
        row("tp_sp", "model", "aot_eager", init="meta_load"),
        row("fsdp_tp", world_size=4, init="meta_load"),
        row("hsdp", world_size=4, init="meta_load"),
        row("fsdp", resume="tp_sp", init="meta_load"),
        row("fsdp", model="moe", init="meta_load"),
    ]


def fp16_rows() -> list[Scenario]:
    """fp16 mixed precision with torch.amp.GradScaler (the way fp16 trains: V100/T4, Ascend
    NPUs), through a loss spike that overflows one step's float16 gradients: FSDP2's fp16
    parameters with float32 reductions (accumulation, its gradient sync on the last
    microbatch, HSDP, FSDP2 x TP, uneven padded shards, a tied pair, MoE experts that may
    get no token, per-block compile, AC, AdamW, clipping after unscale_, a resume) and DDP
    under fp16 autocast: every rank's scaler must see the overflow its shard may not hold,
    and skip with the others."""
    return [
        row("fsdp", mp="fp16"),
        row("fsdp", mp="fp16", accum=2),
        row("fsdp", mp="fp16", accum=2, grad_sync="last"),
        row("fsdp", mp="fp16", optim="adamw"),
        row("fsdp", mp="fp16", shard="uneven"),
        row("fsdp", mp="fp16", tie=True),
        row("fsdp", mp="fp16", model="moe", accum=2),
        row("fsdp", "block", "inductor", mp="fp16"),
        row("fsdp", mp="fp16", ac="full"),
        row("hsdp", world_size=4, mp="fp16"),
        row("fsdp_tp", world_size=4, mp="fp16"),
        row("ddp", mp="fp16"),
        row("ddp", mp="fp16", accum=2, grad_sync="last"),
        # Hugging Face Trainer's and Lightning's fp16 with max_grad_norm: unscale_, then clip
        row("fsdp", mp="fp16", clip="norm"),
        row("fsdp_tp", world_size=4, mp="fp16", clip="norm"),
        row("ddp", mp="fp16", clip="foreach"),
        # a resume carries the scaler's state (HF Trainer's scaler.pt) and the schedule's
        row("fsdp", mp="fp16", resume="single", sched="warmup_cosine"),
    ]
