"""torchtitan#3869: torchtitan's async TP leaves symmetric memory off for the TP group, so
inductor's micro-pipeline TP pass fuses nothing and async TP silently runs as plain TP.

Found on 2xH200 (torch 2.11, torchtitan 0.2.2): suites/test_torchtitan.py's async-TP
cases had 0 fused all-gather matmuls and 0 fused matmul reduce-scatters. torch deprecated
`enable_symm_mem_for_group` ("no need to call this function anymore") and torchtitan
0.2.x stopped calling it, but the pass still skips every group that
`is_symm_mem_enabled_for_group` does not know, and only that deprecated call registers
one. Fix: distci_fixes torchtitan_asynctp_symm_mem (upstream: torchtitan PR 4045).

The test calls torchtitan's own `maybe_enable_async_tp` for an async-TP job on a 2-rank
TP mesh (gloo on CPU is enough: the registration is host-side) and requires the group
to be one the pass will fuse over. torchrun gives it fresh processes, because both the
inductor flag and the registration are process-global.
"""

from __future__ import annotations

import importlib.util

import pytest

from ..conftest import tier_marks

pytestmark = [
    *tier_marks("pr"),
    pytest.mark.skipif(importlib.util.find_spec("torchtitan") is None,
                       reason="torchtitan is not installed in this cell"),
]


@pytest.mark.world_size(2)
@pytest.mark.torchrun(nproc=2)
def test_async_tp_enables_symmetric_memory(dist) -> None:
    if dist.group is None:  # torchrun: this test owns its process group
        dist.init()
    try:
        from torchtitan.config import JobConfig
        from torchtitan.distributed.tensor_parallel import maybe_enable_async_tp
    except ImportError as err:
        pytest.skip(f"this torchtitan has no maybe_enable_async_tp(job_config, tp_mesh): {err}")
    from torch.distributed import _symmetric_memory as symm_mem

    if not hasattr(symm_mem, "is_symm_mem_enabled_for_group"):
        pytest.skip("this torch has no symmetric-memory group registry")
    jc = JobConfig()
    jc.parallelism.tensor_parallel_degree = dist.world_size
    jc.parallelism.enable_async_tensor_parallel = True
    jc.compile.enable = True
    jc.compile.components = ["model"]
    mesh = dist.mesh()
    maybe_enable_async_tp(jc, mesh)
    group = mesh.get_group().group_name
    assert symm_mem.is_symm_mem_enabled_for_group(group), (
        f"torchtitan's maybe_enable_async_tp left symmetric memory off for the TP group {group!r}: "
        "inductor's micro-pipeline TP pass will fuse no all-gather or reduce-scatter (async TP is a no-op)")
