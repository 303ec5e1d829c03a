"""The rank program that checks a multi-node placement: `torchrun ... -m distci.launch.check`.

What every engine's launch must give a rank, checked from inside it: LOCAL_RANK and
GROUP_RANK consistent with RANK, one hostname per node and a different one on each node,
and a (node, local) mesh whose all-reduces give what one process sums. It also times the
two things a multi-node start pays for: the process group's rendezvous and the first
collective (`nox -s bench -- multinode`). Each rank prints one JSON line; the exit code is
non-zero when a check fails. The Kubernetes job and the Slurm smoke run it; stdlib + torch.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

T0_ENV = "DISTCI_LAUNCH_T0"  # wall-clock time the launch started (set by the launcher)


def placement_problems(rank: int, world: int, local: int, per_node: int, group: int,
                       hosts: list[tuple[str, int]]) -> list[str]:
    """What is wrong with one rank's view of the cluster (pure: `hosts` is every rank's
    (hostname, GROUP_RANK), in rank order)."""
    problems = []
    nodes = world // per_node if per_node else 0
    if not per_node or world % per_node:
        problems.append(f"LOCAL_WORLD_SIZE={per_node} does not divide WORLD_SIZE={world}")
        return problems
    if not 0 <= local < per_node:
        problems.append(f"LOCAL_RANK={local} is outside 0..{per_node - 1}")
    if rank != group * per_node + local:
        problems.append(f"RANK={rank} is not GROUP_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK={group * per_node + local}")
    by_group: dict[int, set[str]] = {}
    for host, g in hosts:
        by_group.setdefault(g, set()).add(host)
    if sorted(by_group) != list(range(nodes)):
        problems.append(f"GROUP_RANKs {sorted(by_group)} are not 0..{nodes - 1}")
    split = {g: sorted(h) for g, h in by_group.items() if len(h) > 1}
    if split:
        problems.append(f"a node's ranks report different hostnames: {split}")
    names = [next(iter(h)) for h in by_group.values()]
    if len(set(names)) != len(names):
        problems.append(f"nodes share a hostname: {names}")
    return problems


def main() -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    t0 = float(os.environ.get(T0_ENV) or time.time())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, per_node = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    group = int(os.environ["GROUP_RANK"])
    started = time.time()
    dist.init_process_group("gloo")
    joined = time.time()
    t = torch.ones(1)
    dist.all_reduce(t)
    first = time.time()
    hosts: list = [None] * world
    dist.all_gather_object(hosts, (socket.gethostname(), group))
    problems = placement_problems(rank, world, local, per_node, group, hosts)
    if t.item() != world:
        problems.append(f"the first all-reduce gave {t.item()}, not {world}")
    if not problems:
        nodes = world // per_node
        mesh = init_device_mesh("cpu", (nodes, per_node), mesh_dim_names=("node", "local"))
        for axis, expected in (("node", sum(n * per_node + local + 1 for n in range(nodes))),
                               ("local", sum(group * per_node + k + 1 for k in range(per_node)))):
            v = torch.full((2,), float(rank + 1))
            dist.all_reduce(v, group=mesh.get_group(axis))
            if v.tolist() != [float(expected)] * 2:
                problems.append(f"all-reduce over the {axis} axis gave {v.tolist()}, not {expected}")
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "host": socket.gethostname(), "group_rank": group, "local_rank": local,
                      "launch_to_start_s": round(started - t0, 3), "rendezvous_s": round(joined - started, 3),
                      "first_collective_s": round(first - joined, 3), "problems": problems}), flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
