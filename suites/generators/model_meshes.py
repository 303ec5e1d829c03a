"""How the models generator's trainers BUILD a layout's mesh: the one place its meshes are made.

Vocabulary: the *layout* (model_space's `parallel`) says which mesh axes a structure needs and
their sizes (AXES); the *form* (model_space's `mesh`) says how a trainer builds a mesh with
those axes. Every form gives the same ranks the same roles, so the single-process reference
does not change: a correct run shows the same losses, gradients and parameters under every
form as under `direct`. Where the bugs live is the building: a slice of a larger mesh, a
flattened axis, size-1 axes, meshes wrapped around existing process groups.

Forms, and who builds meshes that way:
  - direct: one `init_device_mesh` of exactly the layout's axes (the harness's `dist.mesh`;
    1-D layouts an unnamed mesh): PyTorch's FSDP2 / TP tutorials.
  - world: one mesh over every named axis torchtitan's ParallelDims knows (pp, dp_replicate,
    dp_shard, cp, tp), the axes the layout does not use kept at size 1, and the layout's mesh
    a SLICE of it; FSDP2's axis is `world["dp_shard", "cp"]._flatten("dp_shard_cp")`, so
    hsdp's mesh is `world["dp_replicate", "dp_shard_cp"]`, a real axis beside a flattened one
    (torchtitan's ParallelDims up to Dec 2025, which keeps its size-1 `dp_shard_mod_ep`;
    Lightning's ModelParallelStrategy builds ("data_parallel", "tensor_parallel") with a
    tensor-parallel size of 1 and slices it; accelerate's ParallelismConfig flattens
    dp_shard_cp the same way).
  - unflatten: a 1-D ("world",) mesh `_unflatten`ed into the five axes, size-1 axes kept, the
    layout's mesh a slice (torchtitan since pytorch/torchtitan#1660; its storage mesh is
    ("pp", "dp_replicate", "dp_shard", "cp", "tp")). torchtitan gives size-1 axes a "fake"
    backend; gloo ranks have none to give, so they keep the real one.
  - from_group: `DeviceMesh.from_group` around process groups the trainer already made: the
    default group for a 1-D layout (Megatron-LM wraps its parallel_state groups this way for
    DTensor; transformers' `from_pretrained(tp_plan="auto", device_mesh=from_group(pg))`),
    one `new_subgroups_by_enumeration` group per axis and the rank grid for a 2-D one
    (`from_group([pp_group, dp_group, tp_group], mesh=...)` in pipeline trainers).
  - singleton: FSDP2 as HSDP over a (1, N) ("dp_replicate", "dp_shard") mesh, what a
    trainer that always builds HSDP's mesh gives with dp_replicate=1 (vllm-omni #5872 "avoid
    singleton replicate DeviceMesh for HSDP"; HunyuanVideo-1.5 #44).

A form the stack lacks (`lacks`: `_flatten`, `_unflatten`, `from_group` over several groups)
is left out with its reason (the test skips), never an error. Meshes are cached on the rank
pool's DistContext beside the harness's own (process groups live as long as the pool).
"""

from __future__ import annotations

import inspect
from typing import Any

from .model_structures import PP_DP_SHARD

MESHES = {"hsdp": ((2, 2), ("dp_replicate", "dp_shard")), "fsdp_tp": ((2, 2), ("dp_shard", "tp")),
          "pp_fsdp": ((2, PP_DP_SHARD), ("pp", "dp_shard")), "pp_tp": ((2, 2), ("pp", "tp"))}
"""The 2-D layouts' meshes, named as torchtitan's ParallelDims names them (model_space.RANKS)."""
AXIS = {"fsdp": "dp_shard", "tp": "tp", "ddp": "dp_replicate", "replicate": "dp_replicate"}
"""The one axis a 1-D layout runs over, by ParallelDims' names (DDP and replicate: dp_replicate)."""
WORLD_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
FLAT_SHARD = "dp_shard_cp"
"""torchtitan's FSDP2 axis: dp_shard and cp flattened (cp is 1 here)."""


def axes(parallel: str, world_size: int) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The layout's axis sizes and names (pp has none: its stages talk over the world group)."""
    if parallel in MESHES:
        return MESHES[parallel]
    return (world_size,), (AXIS[parallel],)


def lacks(form: str) -> str | None:
    """Why this torch cannot build `form` (None: it can)."""
    from torch.distributed.device_mesh import DeviceMesh

    if form == "world" and not hasattr(DeviceMesh, "_flatten"):
        return "mesh=world: this torch's DeviceMesh has no _flatten (torch < 2.5)"
    if form == "unflatten" and not hasattr(DeviceMesh, "_unflatten"):
        return "mesh=unflatten: this torch's DeviceMesh has no _unflatten (torch < 2.10)"
    if form == "from_group":
        wraps = getattr(DeviceMesh, "from_group", None)
        if wraps is None or "mesh" not in inspect.signature(wraps).parameters:
            return "mesh=from_group: this torch's DeviceMesh.from_group takes no groups list + mesh"
    return None


def mesh_of(structure: dict[str, Any], dist: Any) -> Any:
    """The structure's mesh over the harness's ranks, built as its `mesh` form says."""
    form, parallel = structure["mesh"], structure["parallel"]
    if form == "direct":
        shape, names = MESHES.get(parallel, (None, None))
        return dist.mesh(shape, names)
    cache = dist._meshes  # the harness's own cache: meshes live as long as the pool's groups
    if ("models", form, parallel) not in cache:
        cache[("models", form, parallel)] = BUILD[form](parallel, dist)
    return cache[("models", form, parallel)]


def _degrees(parallel: str, world_size: int) -> tuple[int, ...]:
    shape, names = axes(parallel, world_size)
    sizes = dict(zip(names, shape))
    return tuple(sizes.get(a, 1) for a in WORLD_AXES)


def _sliced(full: Any, parallel: str, world_size: int, flat_shard: bool) -> Any:
    names = axes(parallel, world_size)[1]
    if flat_shard and parallel in ("fsdp", "hsdp"):  # torchtitan: FSDP2 over the flattened dp_shard_cp
        full["dp_shard", "cp"]._flatten(FLAT_SHARD)
        names = tuple(FLAT_SHARD if n == "dp_shard" else n for n in names)
    return full[names] if len(names) > 1 else full[names[0]]


def _world(parallel: str, dist: Any) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    full = init_device_mesh(dist.device_type, _degrees(parallel, dist.world_size), mesh_dim_names=WORLD_AXES)
    return _sliced(full, parallel, dist.world_size, flat_shard=True)


def _unflatten(parallel: str, dist: Any) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    world = init_device_mesh(dist.device_type, (dist.world_size,), mesh_dim_names=("world",))
    full = world._unflatten(0, _degrees(parallel, dist.world_size), WORLD_AXES)
    return _sliced(full, parallel, dist.world_size, flat_shard=False)


def _from_group(parallel: str, dist: Any) -> Any:
    import torch
    import torch.distributed as c10d
    from torch.distributed.device_mesh import DeviceMesh

    shape, names = axes(parallel, dist.world_size)
    if len(shape) == 1:
        return DeviceMesh.from_group(c10d.group.WORLD, dist.device_type, mesh_dim_names=names)
    grid = torch.arange(dist.world_size).view(shape)
    groups = []
    for axis in range(grid.ndim):  # every rank creates every group of the axis, in one order
        along = grid.movedim(axis, -1).reshape(-1, shape[axis])
        mine, _ = c10d.new_subgroups_by_enumeration([row.tolist() for row in along])
        groups.append(mine)
    return DeviceMesh.from_group(groups, dist.device_type, mesh=grid, mesh_dim_names=names)


def _singleton(parallel: str, dist: Any) -> Any:
    return dist.mesh((1, dist.world_size), ("dp_replicate", "dp_shard"))


BUILD = {"world": _world, "unflatten": _unflatten, "from_group": _from_group, "singleton": _singleton}
