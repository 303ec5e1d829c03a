"""DistContext: what a distributed test function receives as its `dist` argument."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DistContext:
    """Per-rank facts and helpers for a test body that runs on every rank.

    `group` is the default process group in pool mode; in torchrun mode the test owns
    its process group, so `group` is None until the test calls `init()`.
    """

    rank: int
    world_size: int
    device_type: str
    backend: str
    local_rank: int = 0
    group: Any = None
    _meshes: dict = field(default_factory=dict, repr=False)

    @property
    def device(self):
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, self.local_rank)

    def mesh(self, shape: tuple[int, ...] | None = None, names: tuple[str, ...] | None = None):
        """A DeviceMesh over all ranks (cached per shape and names)."""
        from torch.distributed.device_mesh import init_device_mesh

        shape = tuple(shape or (self.world_size,))
        key = (shape, names)
        if key not in self._meshes:
            kwargs = {"mesh_dim_names": tuple(names)} if names else {}
            self._meshes[key] = init_device_mesh(self.device_type, shape, **kwargs)
        return self._meshes[key]

    def init(self, timeout_s: float | None = None) -> None:
        """Initializes the default process group from torchrun's environment (torchrun mode)."""
        import datetime

        import torch.distributed as dist

        if not dist.is_initialized():
            kwargs = {}
            if timeout_s:
                kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
            dist.init_process_group(self.backend, **kwargs)
        self.group = dist.group.WORLD
