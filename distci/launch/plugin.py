"""`pytest -p distci.harness.plugin -p distci.launch.plugin --distci-nodes=N`: the cell spans N hosts.

Every distributed test then runs as one torchrun launch across the nodes (one agent per
node, c10d rendezvous, `distci.launch.agents`) in place of the rank pool: the ranks see
what they would on a cluster (their node's hostname, LOCAL_RANK, GROUP_RANK,
LOCAL_WORLD_SIZE for a (node, local) mesh). `--distci-hosts` says where the nodes are:
`netns` simulates them on this machine for the session (root), `slurm` takes the nodes of
the Slurm allocation the session runs in. Each node's host, driver and devices go into
the run's stack (`nodes`). A test whose world does not split over the nodes runs on the
first node alone, as it would on one host.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from distci.harness.plugin import harness_of
from distci.harness.protocol import TestRequest
from distci.harness.outcome import Combined
from distci.launch.agents import Hosts, launch_across
from distci.launch.topology import Topology

HOSTS = pytest.StashKey["ClusterSession"]()
HOST_KINDS = ("netns", "slurm")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distci-launch", "distci multi-node launch")
    group.addoption("--distci-nodes", type=int, default=1, help="hosts the cell spans (matrix.toml `nodes`)")
    group.addoption("--distci-hosts", choices=HOST_KINDS, default="netns",
                    help="where the nodes are: netns (simulated on this machine, root) or slurm (the allocation)")


class ClusterSession:
    """The session's nodes and the launcher the harness calls for every distributed test."""

    def __init__(self, hosts: Any, nodes: int, owned: bool) -> None:
        self.hosts = hosts
        self.count = nodes
        self.owned = owned  # simulated hosts are made and removed by this session

    def topology(self, world_size: int) -> Topology:
        if world_size % self.count:
            return Topology(self.hosts.nodes[:1], world_size)
        return Topology(tuple(self.hosts.nodes[: self.count]), world_size // self.count)

    def launch(self, request: TestRequest, nproc: int, device_type: str, timeout_s: float, log_dir: Path, *,
               owns_process_group: bool, pg_timeout_s: float | None = None, token: str = "",
               python: str = sys.executable) -> Combined:
        return launch_across(request, self.hosts, self.topology(nproc), device_type, timeout_s, log_dir,
                             owns_process_group=owns_process_group, pg_timeout_s=pg_timeout_s, token=token,
                             python=python)

    def node_facts(self, python: str = sys.executable) -> list[dict[str, Any]]:
        """Every node's `python -m distci.stack --node`, as that node answers it."""
        facts = []
        for node in self.hosts.nodes[: self.count]:
            env = self.hosts.environment(node)
            cmd = [*self.hosts.exec_prefix(node), "env", *(f"{k}={v}" for k, v in env.items()),
                   python, "-m", "distci.stack", "--node"]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
                facts.append(json.loads(done.stdout) if done.returncode == 0 else
                             {"host": node.hostname, "error": done.stderr.strip()[-500:]})
            except (subprocess.TimeoutExpired, ValueError, OSError) as exc:
                facts.append({"host": node.hostname, "error": f"{type(exc).__name__}: {exc}"[:500]})
        return facts

    def close(self) -> None:
        if self.owned:
            self.hosts.destroy()


def _hosts(kind: str, nodes: int) -> tuple[Hosts, bool]:
    if kind == "slurm":
        from distci.launch.slurm import AllocationHosts

        return AllocationHosts.from_environment(nodes), False
    from distci.errors import InfraError
    from distci.launch.netns import SimulatedHosts

    made = SimulatedHosts(nodes)
    try:
        made.create()
    except InfraError as exc:
        raise pytest.UsageError(f"--distci-nodes={nodes} --distci-hosts=netns: {exc}") from None
    return made, True


@pytest.hookimpl(trylast=True)  # after distci.harness made the session's Harness
def pytest_configure(config: pytest.Config) -> None:
    nodes = config.getoption("--distci-nodes")
    if nodes < 1:
        raise pytest.UsageError(f"--distci-nodes={nodes}: give a whole number >= 1")
    harness = harness_of(config)
    if nodes == 1 or harness is None:
        return
    hosts, owned = _hosts(config.getoption("--distci-hosts"), nodes)
    session = ClusterSession(hosts, nodes, owned)
    config.stash[HOSTS] = session
    harness.mode = "torchrun"
    harness.launcher = session.launch


@pytest.hookimpl(hookwrapper=True)
def pytest_sessionstart(session: pytest.Session):
    yield  # the recorder has captured and written the controller's stack
    cluster = session.config.stash.get(HOSTS, None)
    harness = harness_of(session.config)
    if cluster is None or harness is None or not harness.recorder.enabled:
        return
    harness.recorder.stack.nodes = cluster.node_facts()
    harness.recorder.writer.write_stack(harness.recorder.stack)


def pytest_unconfigure(config: pytest.Config) -> None:
    cluster = config.stash.get(HOSTS, None)
    if cluster is not None:
        cluster.close()
        del config.stash[HOSTS]
