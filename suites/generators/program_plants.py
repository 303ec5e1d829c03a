"""Bugs planted on purpose in the programs runner, for the tests that prove the programs
generator finds and shrinks them (tests/test_fuzz_programs.py). A real run never sets
DISTCI_PROGRAMS_PLANT.

None is shaped like a table column: each sits on one call path of one program shape and
stays quiet elsewhere, as such bugs sit upstream:
  - optim_load_fsdp: a resume from full state dicts (rank 0's, broadcast) under FSDP2
    restores the model but not the optimizer state (set_optimizer_state_dict skipped):
    visible only if the optimizer state moved between the save and the load, under fsdp /
    fsdp_tp, on the full path (the dcp path loads into the optimizer's own tensors in place);
  - buffer_load: a resume restores persistent buffers on rank 0 only (the other ranks keep
    theirs): visible only if a training forward moved the buffer between save and load,
    and not under DDP, whose forward broadcasts rank 0's buffers;
  - sched_resume: a resume drops the LR scheduler's state (it starts over): visible only
    at a scheduler step after a load that followed scheduler steps;
  - zero_grad_ddp: zero_grad(set_to_none=False) under DDP leaves the gradients in place:
    visible right after that form of zero_grad (gradients are compared after every call), under ddp.
  - mp_accumulate_low: under FSDP2's mixed precision, a backward without gradient sync keeps
    the unsharded gradient in bfloat16 (FSDPParam.to_accumulated_grad_if_needed skipped), so
    microbatches accumulate in bfloat16, not the reduce dtype: visible only under fsdp_mp, at a
    synced backward after a no-sync one, and only as rounding (~50 dB): inside a bfloat16
    tolerance against a float32 reference, outside the precision-matched one
    (program_precision.mixed_precision_reference).
  - async_unstaged: dcp.async_save writes the live state dict when it is awaited, not the one
    it was given (no staging copy): visible only where an action between a save=async and the
    load that awaits it moved the model or the optimizer (a step), then at that load.
  - partial_load_all: a partial load (load=model: StateDictOptions(strict=False), the head's
    keys left out) restores the keys it was not given too, from the checkpoint (as a loader
    that fills "missing" keys instead of leaving them): visible only at a load=model after a
    step moved the head since the save.
  - f8_local_scale: precompute_float8_dynamic_scale_for_fsdp takes each float8 weight's scale from
    this rank's shard alone (its all-reduce of the amaxes left out), so the shards of one weight
    are cast to float8 at different scales and FSDP2's all-gather dequantizes them at one: visible
    only under fsdp_f8, at the first forward after a step=precompute, where the shards' amaxes differ.
  - relayout_optim: a restart under another layout (load=LAYOUT, round later_reshard) into a TP
    layout (tp, fsdp_tp) restores the model and the scheduler but not the optimizer's state
    (the freshly made optimizer's zeros stay): visible only at a load=tp / load=fsdp_tp after
    a step with a stateful optimizer (not sgd0) moved the state away from zero.
  - factored_rows: a full-state-dict resume restores optimizer state NOT shaped like its parameter
    (Adafactor's factored row second moment, one value per row) from the other half of its rows,
    as a loader that shards it by the world's rows: visible only with adafactor (the later_optim
    round), at a `load` of a `save=full` taken after a step made the state, where the rows differ.
  - found_inf_local: under fsdp_amp the GradScaler checks each rank's own gradient shards for inf
    and never agrees the answer across ranks (program_scaler._LocalInfCheck): visible only where
    one rank's shard overflows and another's does not, a `fwd_bwd=badlabel` while only the head
    trains (one layer, its block frozen), at the step: that rank skips, the others step.
  - scaler_resume: a resume under fsdp_amp restores the model and the optimizer but not the
    GradScaler (its scaler.pt never read back, as a checkpoint path that forgets it): visible only
    at a full load after a step moved the scale or its growth tracker since the save.
  - ema_stale_shard: under fsdp the EMA's update on ranks other than 0 lerps its shards toward
    the weights of the previous update, not the ones the step just made (a shadow that reads a
    stale copy of its rank's shard, program_hooks.Shadow): visible only at a second step=ema (round
    later_hook) with a step that moved the weights since the first, in the EMA only.
  - ac_reenable: Hugging Face gradient checkpointing switched on again after a generation
    (eval=nogc, round later_ac) without `enable_input_require_grads()`: reentrant checkpoint of
    the first block sees no input that requires grad and returns no gradient for it (torch only
    warns): visible only under LAYOUT_hfac, at the first backward after an eval=nogc.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

PLANT_ENV = "DISTCI_PROGRAMS_PLANT"
PLANTS = ("optim_load_fsdp", "buffer_load", "sched_resume", "zero_grad_ddp", "mp_accumulate_low",
          "async_unstaged", "partial_load_all", "f8_local_scale", "relayout_optim", "factored_rows",
          "scaler_resume", "found_inf_local", "ema_stale_shard", "ac_reenable")


@dataclass(frozen=True)
class Plant:
    """Which planted bug (if any) this run carries; each flag is read at its one call site."""

    name: str = ""

    def skips_optimizer_load(self, layout: str, kind: str) -> bool:
        return self.name == "optim_load_fsdp" and layout in ("fsdp", "fsdp_tp") and kind == "full"

    def keeps_buffers_on_load(self, rank: int) -> bool:
        return self.name == "buffer_load" and rank != 0

    def drops_scheduler_on_load(self) -> bool:
        return self.name == "sched_resume"

    def keeps_grads_on_zero(self, layout: str, set_to_none: bool) -> bool:
        return self.name == "zero_grad_ddp" and layout == "ddp" and not set_to_none

    def accumulates_in_param_dtype(self, layout: str) -> bool:
        return self.name == "mp_accumulate_low" and layout == "fsdp_mp"

    def skips_optimizer_on_relayout(self, target: str) -> bool:
        return self.name == "relayout_optim" and target in ("tp", "fsdp_tp")

    def loads_what_was_left_out(self) -> bool:
        return self.name == "partial_load_all"

    def shifts_factored_state(self, kind: str) -> bool:
        return self.name == "factored_rows" and kind == "full"

    def checks_inf_locally(self, layout: str) -> bool:
        return self.name == "found_inf_local" and layout == "fsdp_amp"

    def keeps_scaler_on_load(self, layout: str) -> bool:
        return self.name == "scaler_resume" and layout == "fsdp_amp"

    def reads_stale_shard_in_ema(self, layout: str, rank: int) -> bool:
        return self.name == "ema_stale_shard" and layout == "fsdp" and rank != 0
    def reenables_without_input_grads(self) -> bool:
        return self.name == "ac_reenable"

    def precomputes_local_scale(self) -> bool:
        return self.name == "f8_local_scale"

    def async_save(self, dcp: Any) -> Callable[..., Any]:
        """dcp.async_save, or under async_unstaged a save of the live tensors deferred to
        the moment it is awaited."""
        if self.name != "async_unstaged":
            return dcp.async_save

        def unstaged(state: Any, checkpoint_id: str, process_group: Any = None) -> Any:
            class Deferred:
                def result(self) -> None:
                    dcp.save(state, checkpoint_id=checkpoint_id, process_group=process_group)
            return Deferred()
        return unstaged


def planted() -> Plant:
    name = os.environ.get(PLANT_ENV, "")
    if name and name not in PLANTS:
        raise ValueError(f"{PLANT_ENV}={name!r} is not a plant; plants: {', '.join(PLANTS)}")
    return Plant(name)
