"""Slurm: a multi-node cell as one batch job; every test's agents started with `srun`.

`sbatch` runs the batch script (`batch_script`) on the allocation's first node: the cell
run's controller, with `DISTCI_HOSTS=slurm`. For each distributed test the launch plugin
starts one torchrun agent per node with `srun --nodes=1 --ntasks=1 --nodelist=<node>
--overlap` (one task per node, in the job's own allocation), the c10d rendezvous on the
first node. Slurm places, confines and cleans up the tasks; distci only asks it to.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from distci.errors import InfraError
from distci.launch.topology import Node

COMMAND_TIMEOUT_S = 60.0


def _run(cmd: list[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(f"`{shlex.join(cmd)}` failed: {exc}") from None
    if done.returncode != 0:
        raise InfraError(f"`{shlex.join(cmd)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


@dataclass(frozen=True)
class AllocationHosts:
    """The nodes of the Slurm allocation this process runs in."""

    nodes: tuple[Node, ...]

    @classmethod
    def from_environment(cls, count: int) -> "AllocationHosts":
        nodelist = os.environ.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise InfraError("--distci-hosts=slurm runs inside a Slurm job (no SLURM_JOB_NODELIST): submit the cell "
                             "with `sbatch` (distci.launch.slurm.batch_script)")
        names = _run(["scontrol", "show", "hostnames", nodelist]).split()
        if len(names) < count:
            raise InfraError(f"the allocation has {len(names)} node(s) ({', '.join(names)}) and the cell needs "
                             f"{count}: submit with --nodes={count}")
        return cls(tuple(Node(k, name, name) for k, name in enumerate(names[:count])))

    def exec_prefix(self, node: Node) -> list[str]:
        return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={node.hostname}", "--overlap",
                "--kill-on-bad-exit=1", "--export=ALL", f"--job-name=distci-agent-{node.index}"]

    def environment(self, node: Node) -> dict[str, str]:
        return {"DISTCI_NODE": node.hostname}

    def reachable(self, node: Node) -> bool:
        """Slurm's own view: a node DOWN, DRAINED or NOT_RESPONDING is unreachable."""
        state = _run(["sinfo", "--noheader", "--nodes", node.hostname, "--format=%T"]).strip().lower()
        return not any(bad in state for bad in ("down", "drain", "not_responding", "fail"))


def batch_script(cell_id: str, nodes: int, *, command: Sequence[str], workdir: Path, time_limit_min: int = 240,
                 cpus_per_node: int | None = None, partition: str | None = None) -> str:
    """The sbatch script of a cell run: one task per node, the controller on the first."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=distci-{cell_id}"[:80],
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --time={time_limit_min}",
        f"#SBATCH --chdir={workdir}",
        f"#SBATCH --output={workdir}/slurm-%j.out",
    ]
    if cpus_per_node:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_node}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += ["set -euo pipefail", "export DISTCI_HOSTS=slurm", f"exec {shlex.join(list(command))}", ""]
    return "\n".join(lines)


def submit(script: Path, *, wait: bool = True, timeout_s: float = 3600.0, prefix: Sequence[str] = ()) -> tuple[str, int]:
    """`sbatch --parsable [--wait] script`: (job id, exit code; 0 when not waiting).
    `prefix` runs sbatch somewhere else (a simulated host's namespace in the tests)."""
    cmd = [*prefix, "sbatch", "--parsable", *(["--wait"] if wait else []), str(script)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise InfraError(f"the Slurm job of {script} did not end within {timeout_s:.0f}s") from None
    job = done.stdout.strip().split(";")[0]
    if not job:
        raise InfraError(f"`{shlex.join(cmd)}` did not submit: {done.stderr.strip()}")
    return job, done.returncode
