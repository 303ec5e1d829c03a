"""The nodes of a multi-node cell and the torchrun agent each one runs.

Vocabulary: a **node** is one host of the cell (a namespace here, a Slurm node or a pod
there); an **agent** is the torchrun process on a node, which joins the c10d rendezvous
and starts that node's ranks; the **endpoint** is where the rendezvous store listens (on
the first node). Ranks are placed by torchrun, not by us: with the c10d backend a node's
GROUP_RANK is its order of joining, so which node holds which rank is read off the
processes afterwards (distci.launch.agents), never assumed from the node's index.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

RDZV_PORT = 29400
JOIN_TIMEOUT_S = 60.0
"""How long an agent waits for every node to join: past it the launch is `infra` naming
the nodes that never came (a node that never joins is a machine problem, not the code's)."""


@dataclass(frozen=True)
class Node:
    """One host of a cell: its index in the declared order, hostname and address."""

    index: int
    hostname: str
    address: str


@dataclass(frozen=True)
class Topology:
    """`nodes` hosts with `ranks_per_node` ranks each; the first node hosts the rendezvous."""

    nodes: tuple[Node, ...]
    ranks_per_node: int
    port: int = RDZV_PORT

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("a topology needs at least one node")
        if self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {self.ranks_per_node}")

    @property
    def world_size(self) -> int:
        return len(self.nodes) * self.ranks_per_node

    @property
    def endpoint(self) -> str:
        return f"{self.nodes[0].address}:{self.port}"

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if name in (node.hostname, str(node.index)):
                return node
        raise KeyError(f"no node {name!r}; nodes: {', '.join(n.hostname for n in self.nodes)}")


def agent_command(topology: Topology, program: list[str], *, run_id: str, python: str = sys.executable,
                  join_timeout_s: float = JOIN_TIMEOUT_S) -> list[str]:
    """The torchrun command every node runs, the same on each (c10d gives node ranks).

    `program` is what each rank runs (`-m module args` or `script args`); `run_id` keeps
    two launches on one endpoint apart. `max_restarts=0`: a failed rank is a result, not
    something to retry behind the test's back.
    """
    return [
        python, "-u", "-m", "torch.distributed.run",
        f"--nnodes={len(topology.nodes)}", f"--nproc-per-node={topology.ranks_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={topology.endpoint}", f"--rdzv-id={run_id}",
        f"--rdzv-conf=join_timeout={int(join_timeout_s)}", "--max-restarts=0",
        *program,
    ]
