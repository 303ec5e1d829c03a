"""What the suites need to know about a device, on top of the harness's device table.

The harness owns the table of accelerators (cpu/gloo, cuda/nccl, npu/hccl:
distci.harness.devices); this module adds the suite-side columns: the training dtype
each accelerator runs in, and which scenario features need which hardware. Keeping
these beside the table, not inside test bodies, is what lets one scenario run
unchanged on every accelerator (DESIGN.md rule 9).
"""

from __future__ import annotations

from dataclasses import dataclass

from distci.harness.devices import DEVICES, detect_device_type, device_capability, device_kind

__all__ = [
    "DEVICES",
    "SuiteDevice",
    "SUITE_DEVICES",
    "detect_device_type",
    "device_capability",
    "device_kind",
    "suite_device",
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


def suite_device(name: str) -> SuiteDevice:
    device_kind(name)
    return SUITE_DEVICES[name]
