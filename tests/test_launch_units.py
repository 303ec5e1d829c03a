"""The launch package's pure parts: the placement check's rules, the agents' command, the
Slurm batch script, which nodes a test's world uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from distci.launch.check import placement_problems
from distci.launch.plugin import ClusterSession
from distci.launch.slurm import batch_script
from distci.launch.topology import Node, Topology, agent_command

NODES = (Node(0, "node0", "198.18.0.1"), Node(1, "node1", "198.18.0.2"))
GOOD = [("node0", 0), ("node0", 0), ("node1", 1), ("node1", 1)]


def test_a_cluster_placement_passes() -> None:
    assert placement_problems(rank=3, world=4, local=1, per_node=2, group=1, hosts=GOOD) == []


@pytest.mark.parametrize(("kwargs", "hosts", "expected"), [
    ({"rank": 3, "local": 0}, GOOD, "RANK=3 is not GROUP_RANK*LOCAL_WORLD_SIZE+LOCAL_RANK=2"),
    ({"local": 2}, GOOD, "LOCAL_RANK=2 is outside 0..1"),
    ({}, [("node0", 0), ("node9", 0), ("node1", 1), ("node1", 1)], "a node's ranks report different hostnames"),
    ({}, [("node0", 0), ("node0", 0), ("node0", 1), ("node0", 1)], "nodes share a hostname"),
    ({}, [("node0", 0), ("node0", 0), ("node1", 2), ("node1", 2)], "GROUP_RANKs [0, 2] are not 0..1"),
    ({"per_node": 3}, GOOD, "LOCAL_WORLD_SIZE=3 does not divide WORLD_SIZE=4"),
])
def test_each_rule_of_the_placement_check_can_fail(kwargs: dict, hosts: list, expected: str) -> None:
    args = {"rank": 3, "world": 4, "local": 1, "per_node": 2, "group": 1, **kwargs}
    problems = placement_problems(hosts=hosts, **args)
    assert any(p.startswith(expected) for p in problems), problems


def test_every_node_runs_the_same_c10d_agent() -> None:
    topo = Topology(NODES, 2)
    cmd = agent_command(topo, ["-m", "x"], run_id="r1", python="py", join_timeout_s=15)
    assert cmd[:4] == ["py", "-u", "-m", "torch.distributed.run"]
    assert {"--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=198.18.0.1:29400",
            "--rdzv-id=r1", "--rdzv-conf=join_timeout=15", "--max-restarts=0"} <= set(cmd)
    assert cmd[-2:] == ["-m", "x"] and topo.world_size == 4
    assert topo.node("node1") is NODES[1]
    with pytest.raises(KeyError, match="no node 'node7'; nodes: node0, node1"):
        topo.node("node7")
    with pytest.raises(ValueError, match="ranks_per_node must be >= 1"):
        Topology(NODES, 0)


class _Hosts:
    nodes = NODES


@pytest.mark.parametrize(("world", "nodes", "per_node"), [(2, 2, 1), (4, 2, 2), (1, 1, 1), (3, 1, 3)])
def test_a_world_that_does_not_split_runs_on_the_first_node(world: int, nodes: int, per_node: int) -> None:
    topo = ClusterSession(_Hosts(), 2, owned=False).topology(world)
    assert (len(topo.nodes), topo.ranks_per_node) == (nodes, per_node)


def test_the_batch_script_asks_for_one_task_per_node() -> None:
    script = batch_script("cell-n2", 2, command=["python", "-m", "distci", "run", "--cell", "cell n2"],
                          workdir=Path("shared-fs/distci"), partition="cpu")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert {"#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --partition=cpu",
            "export DISTCI_HOSTS=slurm"} <= set(lines)
    assert lines[-1] == "exec python -m distci run --cell 'cell n2'"


def test_trainjob_without_the_published_models_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """A controller installed without the kubernetes extra: `distci trainjob` names what to
    install in one line and exits 2 (the models' import is blocked here to make that state)."""
    import os
    import subprocess
    import sys

    block = tmp_path / "sitecustomize.py"
    block.write_text("import sys\nsys.modules['kubeflow_trainer_api'] = None\nsys.modules['kubeflow'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).resolve().parents[1])])}
    proc = subprocess.run([sys.executable, "-m", "distci", "trainjob", "--image", "registry.invalid/distci:cell"],
                          cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "kubeflow-trainer-api" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
