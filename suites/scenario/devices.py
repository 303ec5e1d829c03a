"""What the suites need to know about a device, on top of the harness's device table.

The harness owns the table of accelerators (cpu/gloo, cuda/nccl, npu/hccl:
distci.harness.devices); this module adds the suite-side columns: the training dtype
each accelerator runs in, and which scenario features need which hardware. Keeping
these beside the table, not inside test bodies, is what lets one scenario run
unchanged on every accelerator (DESIGN.md rule 9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distci.harness.devices import DEVICES, detect_device_type, device_capability, device_kind

__all__ = [
    "DEVICES",
    "SuiteDevice",
    "SUITE_DEVICES",
    "detect_device_type",
    "device_capability",
    "device_kind",
    "suite_device",
    "scenario_needs",
]


@dataclass(frozen=True)
class SuiteDevice:
    """Suite-side facts about one accelerator of the harness's table."""

    name: str
    dtype: str
    """Training dtype: fp32 where there is no fast low precision (CPU), bf16 elsewhere."""
    float8_min_sm: dict[str, int] | None
    """Least CUDA SM per Float8 recipe for real float8 kernels; None: no SM to check."""
    float8_collectives: bool
    """Whether the process-group backend moves float8 tensors (gloo has no float8 dtype)."""


SUITE_DEVICES: dict[str, SuiteDevice] = {
    "cpu": SuiteDevice("cpu", "float32", None, float8_collectives=False),
    "cuda": SuiteDevice(
        "cuda",
        "bfloat16",
        # torch._scaled_mm: tensorwise scaling needs SM89 (Ada), rowwise scaling SM90.
        {"tensorwise": 89, "rowwise": 90, "rowwise_with_gw_hp": 90},
        float8_collectives=True,
    ),
    "npu": SuiteDevice("npu", "bfloat16", None, float8_collectives=True),
}


CP_NOT_ON_CPU = ("context parallel cannot shard CPU attention: torch's ring attention handles the CUDA SDPA kernels "
                 "(flash / efficient / cudnn) only, and CPU SDPA runs aten._scaled_dot_product_flash_attention_for_cpu, "
                 "which has no DTensor sharding strategy (measured on torch 2.13.0 and 2.15.0: NotImplementedError "
                 "'Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding strategy "
                 "registered'); cp rows run on CUDA cells")
"""Why a cp row skips on CPU (reports/cpu-nightly-suites.md has the measurement)."""


def suite_device(name: str) -> SuiteDevice:
    device_kind(name)
    return SUITE_DEVICES[name]


def scenario_needs(scenario: Any, device_type: str) -> list[tuple[str, tuple, str]]:
    """Markers (name, args, why) a scenario needs on `device_type`.

    Names are the harness's requires_accelerator / requires_sm, or `skip` for what the
    accelerator's process-group backend cannot do at all.
    """
    device = suite_device(device_type)
    needs: list[tuple[str, tuple, str]] = []
    if scenario.async_tp:
        needs.append(("requires_accelerator", ("cuda",), "async TP fuses collectives over CUDA symmetric memory"))
        needs.append(("requires_sm", (90,), "symmetric-memory async TP kernels need SM90"))
    if scenario.parallel == "cp" and device_type != "cuda":
        needs.append(("skip", (), CP_NOT_ON_CPU if device_type == "cpu" else
                      f"context parallel's ring attention shards the CUDA SDPA kernels only, not {device_type}'s"))
    if scenario.float8 != "none" and device.float8_min_sm:
        needs.append(("requires_sm", (device.float8_min_sm[scenario.float8],),
                      f"float8 {scenario.float8} _scaled_mm kernels"))
    if scenario.float8_all_gather and not device.float8_collectives:
        what = "FSDP2's float8 all-gather of the weights" if scenario.fsdp else \
            "tensorwise Float8 with sequence parallel all-gathers float8 tensors"
        needs.append(("skip", (), f"{what}, which the {device_type} process-group backend cannot carry"))
    return needs

