"""Bodies run on the ranks of a multi-node launch (tests/test_launch_netns.py): each checks
what a rank on a cluster sees, or stays in collectives long enough for a fault to land."""

from __future__ import annotations

import os
import socket
import time


def cluster_view(dist) -> None:
    """Hostnames, LOCAL_RANK, GROUP_RANK and a (node, local) mesh as on a cluster."""
    import torch
    import torch.distributed as d

    local, per_node = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    group = int(os.environ["GROUP_RANK"])
    nodes = dist.world_size // per_node
    assert 0 <= local < per_node and 0 <= group < nodes, (local, per_node, group)
    assert dist.rank == group * per_node + local, (dist.rank, group, local)
    host = socket.gethostname()
    assert host == os.environ["DISTCI_NODE"], (host, os.environ["DISTCI_NODE"])
    seen: list = [None] * dist.world_size
    d.all_gather_object(seen, (host, group, local))
    hosts_by_group = {g: {h for h, gg, _ in seen if gg == g} for g in range(nodes)}
    assert all(len(h) == 1 for h in hosts_by_group.values()), hosts_by_group
    assert len({next(iter(h)) for h in hosts_by_group.values()}) == nodes, f"nodes share a hostname: {seen}"
    mesh = dist.mesh((nodes, per_node), ("node", "local"))
    t = torch.ones(1) * (dist.rank + 1)
    d.all_reduce(t, group=mesh.get_group("node"))
    assert t.item() == sum(g * per_node + local + 1 for g in range(nodes)), t.item()
    t = torch.ones(1)
    d.all_reduce(t, group=mesh.get_group("local"))
    assert t.item() == per_node, t.item()


def collectives_for(dist, seconds: float = 60.0, numel: int = 256) -> None:
    """All-reduces with a known answer, one after another, for `seconds`: a fault injected
    meanwhile lands mid-collective.

    The ranks agree when to stop (a MIN of "my clock has time left" each round): each rank
    reading its own clock desyncs them on a slow link, where one more 1 MiB all-reduce takes
    a second, so one rank would wait in a collective the other never issues."""
    import torch
    import torch.distributed as d

    deadline = time.monotonic() + seconds
    while True:
        go = torch.tensor([1 if time.monotonic() < deadline else 0])
        d.all_reduce(go, op=d.ReduceOp.MIN)
        if not go.item():
            return
        t = torch.ones(numel)
        d.all_reduce(t)
        assert t[0].item() == dist.world_size, t[0].item()
        time.sleep(0.05)


def a_few_collectives(dist) -> None:
    """A few 1 MiB all-reduces: on a link slowed to 8 Mbit/s each takes about a second."""
    collectives_for(dist, 3.0, numel=256 * 1024)
