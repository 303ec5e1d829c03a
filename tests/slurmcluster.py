"""A real Slurm cluster of two nodes on one machine, for tests: slurmctld and one slurmd per
simulated host (network namespace), munge for authentication.

Why two slurmds in namespaces and not one node with two tasks: a node of its own gives each
agent its own hostname and address, so the cell's ranks see two hosts (the (node, local)
rows check that by hostname), and srun really goes from one node to another. `slurmd -N`
names each daemon's node; each runs in its node's namespace with that hostname.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from distci.launch.netns import SimulatedHosts

PACKAGES = ("slurmd", "slurmctld", "slurm-client", "munge")


def install_problem() -> str | None:
    """Why a local Slurm cannot run here (None when it can): installs slurm-wlm if root."""
    if shutil.which("slurmctld") and shutil.which("slurmd") and shutil.which("munged"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "Slurm is not installed and this is not a root Debian machine (apt-get install slurm-wlm munge)"
    done = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES], capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
    if done.returncode != 0:
        return f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr.strip()[-300:]}"
    return None


CONF = """\
ClusterName=distci
SlurmctldHost={head}({head_addr})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={dir}/state
SlurmdSpoolDir={sockets}/spool-%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdTimeout=30
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


class LocalSlurm:
    """slurmctld on node0, a slurmd on every node; `prefix` runs a client on node0."""

    def __init__(self, hosts: SimulatedHosts, workdir: Path) -> None:
        self.hosts = hosts
        self.dir = workdir
        # munged's socket and slurmstepd's (in the spool dirs) must fit a Unix socket path's 108
        # bytes, which pytest's tmp path under an xdist worker (.../popen-gw3/test_.../slurm/
        # spool-node0/node0_1.4294967291) does not: they live in a short directory of their own.
        self.sockets = Path(tempfile.mkdtemp(prefix="distci-slurm-"))
        self.procs: list[subprocess.Popen] = []
        self.conf = workdir / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, SLURM_CONF=str(self.conf))

    @property
    def prefix(self) -> list[str]:
        return self.hosts.exec_prefix(self.hosts.nodes[0])

    def start(self, timeout_s: float = 60.0) -> None:
        (self.dir / "state").mkdir(parents=True, exist_ok=True)
        for node in self.hosts.nodes:
            (self.sockets / f"spool-{node.hostname}").mkdir(exist_ok=True)
        sock = self.sockets / "munge.sock"
        cpus = max(2, os.cpu_count() or 2)
        nodes = "\n".join(f"NodeName={n.hostname} NodeAddr={n.address} CPUs={cpus} State=UNKNOWN"
                          for n in self.hosts.nodes)
        head = self.hosts.nodes[0]
        self.conf.write_text(CONF.format(head=head.hostname, head_addr=head.address, sock=sock, dir=self.dir,
                                         sockets=self.sockets, nodes=nodes))
        self._spawn(["munged", "-F", "--force", f"--socket={sock}", f"--pid-file={self.dir}/munged.pid",
                     f"--log-file={self.dir}/munged.log", f"--seed-file={self.dir}/munged.seed"], "munged")
        self._wait_for(lambda: sock.exists(), timeout_s, "munged's socket")
        self._spawn([*self.prefix, "slurmctld", "-D", "-i"], "slurmctld")
        for node in self.hosts.nodes:
            self._spawn([*self.hosts.exec_prefix(node), "slurmd", "-D", "-N", node.hostname], f"slurmd-{node.hostname}")
        self._wait_for(self._all_idle, timeout_s, "every node idle in sinfo")

    def _spawn(self, cmd: list[str], name: str) -> None:
        log = open(self.dir / f"{name}.out", "ab")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True))
        log.close()

    def _all_idle(self) -> bool:
        done = subprocess.run([*self.prefix, "sinfo", "--noheader", "--format=%n %T"], capture_output=True, text=True,
                              env=self.env, timeout=20)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return len(states) == len(self.hosts.nodes) and all(s.startswith("idle") for s in states.values())

    def _wait_for(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.procs):
                break
            try:
                if ready():
                    return
            except (subprocess.TimeoutExpired, OSError):
                pass
            time.sleep(0.5)
        logs = "\n".join(f"--- {p.name} ---\n{p.read_text()[-1500:]}" for p in sorted(self.dir.glob("*.log")))
        raise RuntimeError(f"local Slurm: no {what} within {timeout_s:.0f}s\n{logs}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        shutil.rmtree(self.sockets, ignore_errors=True)
