"""The one device table: which process-group backend and device module each accelerator uses.

Suites and the harness look devices up here so that a scenario written once runs on
cpu+gloo, cuda+nccl and npu+hccl. torch_npu is imported only when the npu row is used.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceKind:
    name: str
    backend: str
    module: str | None
    import_first: str | None = None

    def device_module(self):
        """torch.cuda / torch.npu, or None for cpu."""
        import torch

        if self.import_first:
            importlib.import_module(self.import_first)
        return getattr(torch, self.module) if self.module else None

    def initialized(self) -> bool:
        """Has this process started the device's runtime (a CUDA/NPU context, its threads)?
        A process that has must not fork ranks that use the device. False for cpu, and for
        a device whose module was never imported (it cannot have started)."""
        import sys

        if self.module is None or "torch" not in sys.modules:
            return False
        if self.import_first and self.import_first not in sys.modules:
            return False
        probe = getattr(getattr(sys.modules["torch"], self.module, None), "is_initialized", None)
        return bool(probe()) if callable(probe) else False

    def fork_poisoned(self) -> bool:
        """Would a fork of this process be unable to use the device? `initialized()` does not
        see every way: `torch.cuda.is_available()` and `device_count()` start the driver and
        mark the process's future forks "bad" without a lazy init, so `is_initialized()` stays
        False while every forked rank fails with "Cannot re-initialize CUDA in forked
        subprocess" (seen on an H100 when a template imported inductor ahead). Asked of a
        child forked for the purpose: torch's at-fork hook has marked it or not. False for cpu
        and for a device whose module was never imported."""
        import sys

        if self.module is None or "torch" not in sys.modules:
            return False
        if self.import_first and self.import_first not in sys.modules:
            return False
        bad = getattr(getattr(sys.modules["torch"], self.module, None), "_is_in_bad_fork", None)
        if not callable(bad):
            return False
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child only answers
            try:
                code = 1 if bad() else 0
            except BaseException:  # noqa: BLE001 - an answer the parent reads as "not known"
                code = 2
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status) == 1

    def count(self) -> int:
        mod = self.device_module()
        if mod is None:
            return os.cpu_count() or 1
        return mod.device_count() if mod.is_available() else 0


DEVICES: dict[str, DeviceKind] = {
    "cpu": DeviceKind("cpu", "gloo", None),
    "cuda": DeviceKind("cuda", "nccl", "cuda"),
    "npu": DeviceKind("npu", "hccl", "npu", import_first="torch_npu"),
}


def device_kind(name: str) -> DeviceKind:
    try:
        return DEVICES[name]
    except KeyError:
        raise ValueError(f"unknown device type {name!r}; known: {', '.join(DEVICES)}") from None


def detect_device_type() -> str:
    """The accelerator a run uses when none is asked for: DISTCI_DEVICE, else what is present."""
    wanted = os.environ.get("DISTCI_DEVICE")
    if wanted:
        device_kind(wanted)
        return wanted
    import torch

    if torch.cuda.is_available():
        return "cuda"
    try:
        importlib.import_module("torch_npu")
        if torch.npu.is_available():  # type: ignore[attr-defined]
            return "npu"
    except ImportError:
        pass
    return "cpu"


ACCELERATOR_NODES = ("/dev/nvidia*", "/dev/kfd", "/dev/dxg", "/dev/davinci*")
"""Device nodes of the accelerators torch can use (NVIDIA, ROCm, WSL's GPU, Ascend NPU)."""


def guess_device_type() -> str | None:
    """detect_device_type()'s answer where it is certain without importing torch (seconds):
    DISTCI_DEVICE, or `cpu` on a machine with no accelerator device node; None otherwise."""
    import glob

    wanted = os.environ.get("DISTCI_DEVICE")
    if wanted:
        return wanted
    return None if any(glob.glob(pattern) for pattern in ACCELERATOR_NODES) else "cpu"


def device_capability(device_type: str) -> tuple[int, int] | None:
    """(major, minor) compute capability on CUDA; None elsewhere."""
    if device_type != "cuda":
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(0))  # type: ignore[return-value]
