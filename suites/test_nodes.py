"""Rows that need nodes: meshes whose axes cross hosts, as a multi-node cell places ranks.

torchrun tells each rank its node's share of the world (LOCAL_WORLD_SIZE) and its node
(GROUP_RANK); a mesh built (node, local) then puts its first axis across hosts. Each row
checks the placement by hostname (the axis really crosses hosts, the other stays on one)
and the numbers against what one process computes. On one host (the rank pool, or
torchrun on one node) every row skips with the reason: there is no node axis to cross.
"""

from __future__ import annotations

import os
import socket

import pytest

from .judges.checks import require
from .conftest import tier_marks
from .scenario.table import TABLE
from .test_scenarios import scenario_problems, timeout_of


def nodes_of(world_size: int) -> int:
    """Hosts this world spans: WORLD_SIZE over torchrun's LOCAL_WORLD_SIZE (1 without it)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE") or world_size)
    return world_size // local if local and world_size % local == 0 else 1


def skip_on_one_host(dist) -> tuple[int, int]:
    nodes = nodes_of(dist.world_size)
    if nodes < 2:
        pytest.skip("needs a cell whose world spans hosts (matrix.toml nodes > 1); this one runs on one host")
    return nodes, dist.world_size // nodes


def hosts_of_group(dist, mesh, axis: str) -> set[str]:
    """The hostnames of the ranks in this rank's group of mesh axis `axis`."""
    import torch.distributed as d

    seen: list = [None] * dist.world_size
    d.all_gather_object(seen, (dist.rank, socket.gethostname()))
    host = dict(seen)
    return {host[r] for r in d.get_process_group_ranks(mesh.get_group(axis))}


@pytest.mark.parametrize("nothing", [pytest.param(None, id="ws4", marks=[pytest.mark.world_size(4), *tier_marks("pr")])])
def test_node_local_mesh(dist, nothing) -> None:
    """A (node, local) mesh: `node` groups hold one rank of every host, `local` groups one
    host's ranks; an all-reduce over each gives what one process sums."""
    import torch
    import torch.distributed as d

    nodes, per_node = skip_on_one_host(dist)
    assert int(os.environ["GROUP_RANK"]) == dist.rank // per_node
    mesh = dist.mesh((nodes, per_node), ("node", "local"))
    across = hosts_of_group(dist, mesh, "node")
    within = hosts_of_group(dist, mesh, "local")
    assert len(across) == nodes, f"the node axis of rank {dist.rank} stays on {across}"
    assert within == {socket.gethostname()}, f"the local axis of rank {dist.rank} leaves its host: {within}"
    local = dist.rank % per_node
    t = torch.full((4,), float(dist.rank + 1))
    d.all_reduce(t, group=mesh.get_group("node"))
    assert t.tolist() == [float(sum(n * per_node + local + 1 for n in range(nodes)))] * 4
    t = torch.full((4,), float(dist.rank + 1))
    d.all_reduce(t, group=mesh.get_group("local"))
    node = dist.rank // per_node
    assert t.tolist() == [float(sum(node * per_node + k + 1 for k in range(per_node)))] * 4


HSDP = next(s for s in TABLE if s.parallel == "hsdp" and s.id == "hsdp-eager-ws4")


@pytest.mark.parametrize("scenario", [pytest.param(HSDP, id=HSDP.id, marks=[
    pytest.mark.world_size(HSDP.world_size), pytest.mark.dist_timeout(timeout_of(HSDP)), *tier_marks("pr")])])
def test_hsdp_replicates_across_nodes(dist, scenario) -> None:
    """HSDP as clusters run it: FSDP2 shards within a host, replicas across hosts (the
    dp_replicate axis of the scenario's mesh crosses nodes), and the training step matches
    its single-process reference."""
    nodes, per_node = skip_on_one_host(dist)
    if dist.group is None:
        dist.init()
    mesh = dist.mesh((2, dist.world_size // 2), ("dp_replicate", "dp_shard"))
    replicas = hosts_of_group(dist, mesh, "dp_replicate")
    shards = hosts_of_group(dist, mesh, "dp_shard")
    if per_node != dist.world_size // 2:
        pytest.skip(f"the hsdp row's mesh is 2 x {dist.world_size // 2}; this cell has {nodes} nodes of {per_node}")
    assert len(replicas) == 2 and len(shards) == 1, f"replicas on {replicas}, shards on {shards}"
    require(scenario_problems(dist, scenario), f"{scenario.id} across {nodes} nodes")
