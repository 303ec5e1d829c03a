"""The forms of a training program's drawn values (distci/training_program.py's record): FORMS,
and the later rounds of forms, each a table from trainer code with how often it picks and the
stream it draws from (LATER_ROUNDS).

Why a module of its own: every round that widens the programs generator adds a table here, and
the program's grammar (training_program.py) stays one screen of parser and preconditions. A form
is a variant of a drawn value that real trainers also write; `draw` (distci/fuzz/programs.py)
picks it from a stream of its own, so adding one never moves a seed's earlier draws.

Pure data and pure functions: no torch.
"""

from __future__ import annotations

import functools

FORMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("layout", "fsdp"): ("fsdp_mp",),
    ("optim", "sgd"): ("sgd0",),
    ("optim", "adamw"): ("adamw_groups",),
    ("unfreeze", "block0"): ("block0_group",),
    ("unfreeze", "head"): ("head_group",),
    ("save", "dcp"): ("flat",),
}
"""(what, drawn value) -> its forms (module docstring): drawn from their own stream."""
LATER_FORMS: dict[tuple[str, str], tuple[str, ...]] = {
    ("layout", "fsdp"): ("fsdp_offload",),
    ("fwd_bwd", "sync"): ("twice",),
    ("clip", "1.0"): ("value",),
    ("save", "dcp"): ("async",),
}
"""Forms added after FORMS (issue 40's second trial, 2026-12-07), each from trainer code:
  - fsdp_offload: FSDP2 with CPUOffloadPolicy (torchtune's `fsdp_cpu_offload`,
    `torchtune/training/_distributed.py` shard_model; accelerate's FSDP2 `cpu_offload`,
    `src/accelerate/utils/fsdp_utils.py` fsdp2_prepare_model; verl's `offload_policy`);
  - fwd_bwd=twice: two forwards (the two halves of the batch) before one backward of their
    mean loss: GAN discriminators (real, then fake), two-view contrastive losses (SimCLR /
    CLIP-style towers called per view), DPO written with separate chosen and rejected forwards;
  - clip=value: torch.nn.utils.clip_grad_value_ (Lightning `gradient_clip_algorithm="value"`,
    accelerate `Accelerator.clip_grad_value_`);
  - save=async: dcp.async_save, training goes on, the next save or load waits for it
    (torchtitan `components/checkpoint.py`, `async_mode="async"`).
Drawn from a third stream only where the forms stream left the plain value (`LATER_P`), so
every program drawn before them is drawn again with at most these values changed."""
LATER_P = 0.25
"""How often a value that has later forms takes one."""
LATER_FORMS_2: dict[tuple[str, str], tuple[str, ...]] = {
    ("layout", "fsdp"): ("hsdp",),
    ("fwd_bwd", "nosync"): ("noreduce",),
    ("reshard", "false"): ("forward_false", "unshard"),
    ("reshard", "true"): ("prefetch", "divide"),
    ("eval", "no_grad"): ("generate",),
    ("load", ""): ("model",),
    ("compile", "aot_eager"): ("blocks",),
}
"""The second round of later forms (issue 40's third trial, the same day: FSDP2's methods and
meshes, reports/fuzz-programs-2026-12-07-redteam2.md), each from trainer code:
  - hsdp: FSDP2 on ParallelDims' (dp_replicate, dp_shard) mesh, the loss averaged over their
    `_flatten("dp")` (torchtitan `distributed/parallel_dims.py`, `data_parallel_replicate_degree`;
    accelerate's and Lightning's HSDP device meshes);
  - fwd_bwd=noreduce (hsdp): accumulation that reduce-scatters but defers the all-reduce across
    replicas, set_requires_all_reduce(False) (torchtitan train_step since its PR #4505, VeOmni,
    NVIDIA cosmos-framework's ddp_sync_grad);
  - reshard=forward_false: set_reshard_after_forward(False) (torchtitan's "never" policy and its
    chunked loss's lm_head, torchtune's generation for GRPO); reshard=unshard: explicit unshard()
    of every FSDP2 module, then reshard() in reverse (torchtitan `components/loss.py`, torchtune
    `training/_distributed.py` recursive_reshard); reshard=prefetch: set_modules_to_forward_prefetch
    / set_modules_to_backward_prefetch block to block (torchtitan `distributed/fsdp.py` with EP,
    verl's forward_prefetch); reshard=divide: set_gradient_divide_factor(1.0) and the loss divided
    by the data-parallel size by the loop (torchtitan disable_fsdp_gradient_division with its
    global token count);
  - eval=generate: a generate-style method, registered with register_fsdp_forward_method
    (transformers' generate under accelerate's FSDP2, TRL / torchtune generation for RL);
  - load=model: the model alone, its head left out, StateDictOptions(strict=False) (torchtune and
    Hugging Face `load_state_dict(strict=False)`; torchtitan's model-only first load);
  - compile=blocks: torch.compile per block (torchtitan `apply_compile`), in place, mid-run.
Drawn from a fourth stream, consulted only where round 1's left the plain value, so every
program drawn before them (round 1's forms included) is drawn again with at most these values
changed (tests/test_fuzz_reach.py)."""
LATER_P_2 = 0.5
"""How often a value takes a round-2 form: most programs make one reshard, eval or load at
most, so at a quarter a 15-minute run draws each form a handful of times."""
LATER_FORMS_3: dict[tuple[str, str], tuple[str, ...]] = {
    ("layout", "fsdp"): ("fsdp_f8",),
    ("layout", "tp"): ("tp_f8",),
    ("step", ""): ("precompute",),
}
"""The third round (issue 40, items 1 and 6: float8 training, reports/fuzz-programs-2026-12-07-float8.md),
from torchtitan `components/quantization/float8.py` (Float8LinearConverter):
  - fsdp_f8: `convert_to_float8_training(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True,
    emulate=...), module_filter_fn=...)` before parallelizing (the output head left in high
    precision, torchtitan's `filter_fqns=["output"]`), then FSDP2 per block and the root;
  - tp_f8: the same conversion, then TP with torchao's Float8ColwiseParallel / Float8RowwiseParallel
    (torchtitan's tensorwise TP plan; its models' linears carry no bias, and neither do these:
    program_float8.py says why);
  - step=precompute (fsdp_f8 only): the optimizer step, then `precompute_float8_dynamic_scale_for_fsdp(model)`,
    registered as the optimizer's step post-hook so every later step precomputes too (torchtitan
    `post_optimizer_hook`, `precompute_float8_dynamic_scale_for_fsdp=True`).
Drawn from a fifth stream, consulted only where rounds 1 and 2 left the plain value."""
LATER_P_3 = 0.5
"""How often a value takes a round-3 form: a float8 run restricted with `--layout fsdp_f8` then
precomputes after about half its steps."""
RELAYOUTS = ("fsdp", "tp", "fsdp_tp", "ddp", "hsdp")
"""The layouts a checkpoint is loaded under by `load=LAYOUT` (LATER_FORMS_RESHARD)."""
LATER_FORMS_RESHARD: dict[tuple[str, str], tuple[str, ...]] = {("load", ""): RELAYOUTS + ("file",)}
"""Round `later_reshard` (issue 40, items 1 and 6: restarts under another parallelism,
reports/fuzz-programs-2026-12-07-reshard.md). load=LAYOUT: the model and optimizer built again
under LAYOUT, the checkpoint resharded into them by DCP (torchtitan `components/checkpoint.py`
with another parallelism config; Lightning's and accelerate's resumes under another strategy),
training going on under LAYOUT (later preconditions read State.layout); load=file: through one
file on rank 0 (`dcp_to_torch_save` then a full load broadcast from rank 0, as Hugging Face
loads sharded models; torch.save then `torch_save_to_dcp`, torchtitan's initial_load_path) into
the model built again. A restart holds no gradients (tests/test_fuzz_reach.py)."""
LATER_P_RESHARD = 0.7
"""How often a plain `load` the earlier rounds left plain takes a restart form: loads are
drawn often, round 2 takes half of them, and a relayout is what this round is for."""
LATER_FORMS_OPTIM: dict[tuple[str, str], tuple[str, ...]] = {
    ("optim", "adamw"): ("adamw_fused", "adamw_foreach", "adam", "nadam", "radam", "adafactor", "muon"),
    ("optim", "sgd"): ("adagrad", "rmsprop"),
}
"""Round `later_optim` (issue 40, items 1, 6, 7: the optimizers trainers configure,
reports/fuzz-programs-2026-12-08-optimizers.md; suites/generators/program_optimizers.py makes
each, for the reference too): AdamW fused / foreach (torchtitan `implementation`, fused its
default; HF `adamw_torch_fused`), Adam (torchtitan), NAdam / RAdam (torchtune configs),
Adafactor (HF `optim="adafactor"`: row / column state not shaped like its parameter), Muon on
the matrices + AdamW (torchtitan's DistMuon container); Adagrad (state made in its constructor,
accelerate #3855), RMSprop (HF `optim=`). A form the stack lacks skips with its reason."""
LATER_P_OPTIM = 0.8
"""Most plain adamw / sgd programs take one: a 12-minute run draws each form a few times."""
LATER_FORMS_AMP: dict[tuple[str, str], tuple[str, ...]] = {
    ("layout", "fsdp"): ("fsdp_amp", "hsdp_amp"),
    ("layout", "tp"): ("tp_amp",),
    ("layout", "fsdp_tp"): ("fsdp_tp_amp",),
    ("layout", "ddp"): ("ddp_amp",),
    ("fwd_bwd", "sync"): ("spike", "badlabel"),
}
"""The loss-scaling round (issue 40, items 1, 6, 7: fp16 training's GradScaler,
reports/fuzz-programs-2026-12-08-amp.md), from trainer code:
  - LAYOUT_amp: the loop trains through torch.amp.GradScaler: `scaler.scale(loss).backward()`,
    `scaler.unscale_(optimizer)` before a clip, `scaler.step(optimizer)` (skipped when a gradient
    is inf or nan) and `scaler.update()`, the scaler's state_dict saved beside the checkpoint and
    loaded on resume (accelerate `Accelerator.backward` / `clip_grad_norm_` / AcceleratedOptimizer.step
    and `save_state`'s scaler.pt with mixed_precision="fp16", FSDP2 included; Hugging Face Trainer
    fp16=True; Lightning MixedPrecision("16-mixed") under its FSDP and ModelParallel strategies;
    torchtitan docs/fsdp.md "GradScaler enabled for FSDP2"); hsdp_amp on 4 ranks only;
  - fwd_bwd=spike (LAYOUT_amp): an outlier batch, data-parallel rank 0's loss backpropagated
    2**127 times over, so its scaled gradients overflow, as fp16 runs meet an overflow: the other
    ranks learn of it only through the gradient reduction, and every scaler must skip the step;
  - fwd_bwd=badlabel (LAYOUT_amp): a corrupt sample, the first target of data-parallel rank 0 an
    inf (a non-finite loss, which fp16 trainers survive because the scaler skips its step): its
    gradient is non-finite in the head's first output row only until the blocks' gradients take
    it, so where only the head trains (its block frozen) the overflow sits in ONE rank's shard of
    the head and the scalers must agree on it through found_inf's all-reduce.
Drawn from the stream `later_amp`, consulted only where every earlier round left the plain value."""
LATER_P_AMP = 0.3
"""How often a value takes a loss-scaling form: a base layout trains with a scaler in about a
third of its programs, and a third of such a program's backwards spike (most steps still train)."""
LATER_FORMS_HOOK: dict[tuple[str, str], tuple[str, ...]] = {
    ("step", ""): ("ema",),
    ("eval", "inference_mode"): ("ema",),
    ("clip", "1.0"): ("total_norm", "foreach"),
    ("fwd_bwd", "sync"): ("inbwd",),
}
"""Round `later_hook` (issue 40, items 1, 6, 7: the calls trainers hang on the step and on
backward, reports/fuzz-programs-2026-12-09-hooks.md; suites/generators/program_hooks.py):
  - step=ema: the step, then `AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(decay),
    use_buffers=True).update_parameters(model)`, the averaged copy made at the first (Lightning
    `EMAWeightAveraging`, timm ModelEmaV3's foreach lerp, diffusers EMAModel.step); under FSDP2 /
    TP the copy is a deepcopy holding DTensors; eval=ema: the eval forward through that copy;
  - clip=total_norm: `get_total_norm` of the gradients, the DTensor norm made full, then
    `clip_grads_with_norm_` with it (torchtitan dist_utils.clip_grad_norm_); clip=foreach:
    clip_grad_norm_(foreach=True, error_if_nonfinite=True); both at max_norm 1.0;
  - fwd_bwd=inbwd: the optimizer stepped inside backward, each parameter's gradient stepped by
    its register_post_accumulate_grad_hook and then dropped (torchtune `optimizer_in_bwd=True`,
    torch.distributed.optim._apply_optimizer_in_backward); FSDP2 calls the hook on the sharded
    parameter after its reduce-scatter.
Drawn from the stream `later_hook`, consulted only where every earlier round left the value plain."""
LATER_P_HOOK = 0.4
"""A plain step takes its EMA in about two programs of five; inbwd needs a backward holding no
gradient (the first, or one after zero_grad or a load), so it is drawn at the same rate."""
LATER_FORMS_AC: dict[tuple[str, str], tuple[str, ...]] = {
    ("layout", "fsdp"): ("fsdp_ac", "fsdp_sac", "fsdp_cac", "fsdp_hfac"),
    ("layout", "ddp"): ("ddp_ac", "ddp_hfac"),
    ("layout", "tp"): ("tp_ac",),
    ("layout", "fsdp_tp"): ("fsdp_tp_ac",),
    ("eval", "no_grad"): ("nogc",),
}
"""The activation-checkpointing round (issue 40, items 1, 6, 7: reports/fuzz-programs-2026-12-09-ac.md;
suites/generators/program_checkpointing.py applies each to the run and the reference alike),
from trainer code:
  - LAYOUT_ac: torchtitan `distributed/activation_checkpoint.py` / torchtune
    `set_activation_checkpointing`: every block in `checkpoint_wrapper` (non-reentrant) after TP
    and before FSDP2 or DDP (torchtitan's order; Lightning's `activation_checkpointing_policy`);
  - fsdp_sac: torchtitan's op-level selective AC, the wrapper with a `context_fn` of
    create_selective_checkpoint_contexts that saves the matmuls' outputs;
  - fsdp_cac: the composable `torch.distributed._composable.checkpoint(block)`, fully_shard's
    sibling API, in place before fully_shard(block);
  - LAYOUT_hfac: Hugging Face `gradient_checkpointing_enable()`: the model's forward calls
    `checkpoint(block.__call__, x, use_reentrant=True)` per block, from outside the block's
    FSDP2 / DDP hooks, with `enable_input_require_grads()` (its default since reentrant needs an
    input that requires grad), then accelerate's FSDP2 / DDP wrap (HF Trainer turns DDP's
    find_unused_parameters off under gradient checkpointing);
  - eval=nogc (LAYOUT_hfac): TRL's generation between training steps:
    `gradient_checkpointing_disable()`, generate under no_grad, `gradient_checkpointing_enable()`
    again mid-run.
Drawn from the stream `later_ac`, consulted only where every earlier round left the plain value."""
LATER_P_AC = 0.5
"""How often a value takes a checkpointing form: half the plain fsdp / ddp / tp / fsdp_tp
programs the earlier rounds leave checkpoint their blocks, and half their plain evals cycle it."""
LATER_ROUNDS: tuple[tuple[str, dict, float], ...] = (
    ("later", LATER_FORMS, LATER_P),
    ("later2", LATER_FORMS_2, LATER_P_2),
    ("later3", LATER_FORMS_3, LATER_P_3),
    ("later_reshard", LATER_FORMS_RESHARD, LATER_P_RESHARD),
    ("later_optim", LATER_FORMS_OPTIM, LATER_P_OPTIM),
    ("later_amp", LATER_FORMS_AMP, LATER_P_AMP),
    ("later_hook", LATER_FORMS_HOOK, LATER_P_HOOK),
    ("later_ac", LATER_FORMS_AC, LATER_P_AC),
)
"""The later rounds in order: (stream, table, how often it picks). Round k draws from stream
`{seed}/{i}/STREAM`; a round's stream is named once and never by its position, so rounds
written on branches side by side keep their draws whatever order they land in. `draw(...,
rounds=NAMES)` consults those only: a seed as it drew when only they existed."""


def forms(what: str, value: str) -> tuple[str, ...]:
    """`value` and its forms, `value` first."""
    return (value,) + FORMS.get((what, value), ())


def base_of(what: str, value: str) -> str:
    """The drawn value `value` is a form of (itself if none)."""
    return _bases().get((what, value), value)


@functools.cache
def _bases() -> dict[tuple[str, str], str]:
    """(what, form) -> the value it is a form of, the first table naming it winning (FORMS, then
    the later rounds in order). Built once: the draw asks for every arg of every action it
    considers, and scanning the tables each time was 80 % of a program's draw (cProfile,
    2026-12-07: 300 draws 4.5 s, base_of 3.7 s). The tables are constants."""
    bases: dict[tuple[str, str], str] = {}
    for table in (FORMS, *(t for _, t, _ in LATER_ROUNDS)):
        for (what, value), reached in table.items():
            for form in reached:
                bases.setdefault((what, form), value)
    return bases


def is_form(what: str, value: str) -> bool:
    """Whether `value` is only ever reached as a form of another value."""
    return base_of(what, value) != value
