"""torchtitan#3869: torchtitan's async TP leaves symmetric memory off for the TP group, so
inductor's micro-pipeline TP pass fuses nothing and async TP silently runs as plain TP.

Found on 2xH200 (torch 2.11, torchtitan 0.2.2): suites/test_torchtitan.py's async-TP
cases had 0 fused all-gather matmuls and 0 fused matmul reduce-scatters. torch deprecated
`enable_symm_mem_for_group` ("no need to call this function anymore") and torchtitan
0.2.x stopped calling it, but the pass still skips every group that
`is_symm_mem_enabled_for_group` does not know, and only that deprecated call registers
one. Fix: distci_fixes torchtitan_asynctp_symm_mem (upstream: torchtitan PR 4045).

The test calls torchtitan's own async-TP switch (through suites/titan's adapter for the
installed API line: 0.2.x `tensor_parallel.maybe_enable_async_tp(job_config, tp_mesh)`,
0.3.x `compile._maybe_enable_async_tp(compile_config, tp_mesh)`, which carries upstream's
fix) for an async-TP job on a 2-rank TP mesh (gloo on CPU is enough: the registration is
host-side) and requires the group to be one the pass will fuse over. When the gate says
no, the test registers the group itself, as upstream's fix does: if the gate then says
yes, torchtitan left it off (the bug); if it still says no, symmetric memory is not
available for this group on this device at all (torch 2.15's gate asks whether the
current accelerator has a symmetric-memory backend; CPU has none), and the test skips.
torchrun gives it fresh processes, because both the inductor flag and the registration
are process-global.
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
    import warnings

    from torch.distributed import _symmetric_memory as symm_mem

    from ..titan import select_or_skip

    line = select_or_skip()
    if not hasattr(symm_mem, "is_symm_mem_enabled_for_group"):
        pytest.skip("this torch has no symmetric-memory group registry")
    mesh = dist.mesh()
    line.enable_async_tp(mesh)
    group = mesh.get_group().group_name
    enabled = symm_mem.is_symm_mem_enabled_for_group(group)
    if not enabled:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(group)
        if not symm_mem.is_symm_mem_enabled_for_group(group):
            pytest.skip("symmetric memory is unavailable for this group here, even registered by hand "
                        "(torch's gate asks for the accelerator's symmetric-memory backend): nothing to prove")
    assert enabled, (
        f"torchtitan's async-TP switch ({line.name} adapter) left symmetric memory off for the TP group {group!r}: "
        "inductor's micro-pipeline TP pass will fuse no all-gather or reduce-scatter (async TP is a no-op)")
