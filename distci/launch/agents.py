"""One test across nodes: a torchrun agent per node, c10d rendezvous, judged as on one host.

The multi-node twin of `distci.harness.torchrun.launch`: the same request file and rank
program (`distci.harness.torchrun_entry`), the same rank reports and the same rules
(`distci.harness.outcome.combine`), so a fault across nodes gets the verdict it would get
on one host, and the message names the node:
- a node whose agent never got its ranks going (it never joined the rendezvous, or its
  link was down from the start) is `infra` naming it, not a test failure;
- an agent that dies takes its ranks with it (they die with their parent): `crash`, and
  the message says on which node;
- ranks stuck past the timeout are `hang`/`timeout` with every rank's stack (a stack is
  taken by signal, on any node) and the nodes whose link is down named.
Afterwards every agent's tree is killed and each node is checked for leftovers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from distci.harness import procs
from distci.harness.outcome import Combined, combine, describe_exit
from distci.harness.pool import DUMP_SETTLE_S, FAILURE_GRACE_S, worker_env
from distci.harness.protocol import TestRequest
from distci.harness.torchrun import attach_logs, read_rank_reports, write_request
from distci.launch.topology import JOIN_TIMEOUT_S, Node, Topology, agent_command

START_MARGIN_S = 120.0  # past the join timeout: importing torch and the ranks' own rendezvous


class Hosts(Protocol):
    """Where a node's agent runs: a prefix for its command, and what its environment adds."""

    def exec_prefix(self, node: Node) -> list[str]: ...

    def environment(self, node: Node) -> dict[str, str]: ...

    def reachable(self, node: Node) -> bool: ...


@dataclass
class _Agent:
    node: Node
    proc: subprocess.Popen
    log_path: Path
    offset: int


def launch_across(request: TestRequest, hosts: Hosts, topology: Topology, device_type: str, timeout_s: float,
                  log_dir: Path, *, owns_process_group: bool, pg_timeout_s: float | None = None, token: str = "",
                  python: str = sys.executable, join_timeout_s: float = JOIN_TIMEOUT_S,
                  on_started: Callable[[dict[str, subprocess.Popen]], None] | None = None) -> Combined:
    """Run `request` on every rank of `topology`; `on_started(agents_by_hostname)` is called
    once every rank is in its test (fault tests inject there)."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="distci-nodes-"))
    req_file = write_request(work, request, device_type, timeout_s, log_dir,
                             owns_process_group=owns_process_group, pg_timeout_s=pg_timeout_s)
    world = topology.world_size
    rank_logs = [log_dir / f"torchrun-rank{rank}.log" for rank in range(world)]
    rank_offsets = [p.stat().st_size if p.exists() else 0 for p in rank_logs]
    token = token or procs.run_token()
    program = agent_command(topology, ["-m", "distci.harness.torchrun_entry", str(req_file)],
                            run_id=uuid.uuid4().hex[:12], python=python, join_timeout_s=join_timeout_s)
    start = time.monotonic()
    agents: list[_Agent] = []
    exits: dict[str, int | None] = {}
    try:
        for node in topology.nodes:
            env = dict(worker_env(device_type, world, log_dir, token), **hosts.environment(node))
            # The request's arguments unpickle before the test's sys.path is set up, and an
            # engine may start the agent in another directory (sbatch --chdir): give it the path.
            env["PYTHONPATH"] = os.pathsep.join([*request.sys_path, *filter(None, [env.get("PYTHONPATH")])])
            log_path = log_dir / f"agent-{node.hostname}.log"
            with open(log_path, "ab") as log:
                offset = log.tell()
                log.write(f"\n===== {node.hostname}: {request.nodeid} =====\n".encode())
                log.flush()
                proc = procs.start_owned([*hosts.exec_prefix(node), *program], env=env, token=token, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            agents.append(_Agent(node, proc, log_path, offset))
        ready = _await_ready(agents, work, world, join_timeout_s + START_MARGIN_S)
        where = _rank_nodes(agents, work, world)
        if not ready:
            return _not_started(agents, work, world, where, topology, hosts, time.monotonic() - start)
        if on_started is not None:
            on_started({a.node.hostname: a.proc for a in agents})
        timed_out = _await_end(agents, time.monotonic() + timeout_s)
        exits = {a.node.hostname: a.proc.returncode for a in agents}
        states = read_rank_reports(work, world, timed_out)
        for st in states:  # a rank whose agent is gone died with it: crashed, not stuck
            code = exits.get(where[st.rank].node.hostname) if st.rank in where else None
            if st.report is None and (code is not None or not st.stuck):
                st.stuck, st.stack, st.exit_code = False, "", code or 1
        if timed_out:
            time.sleep(DUMP_SETTLE_S)
    finally:
        for agent in agents:
            procs.kill_tree(agent.proc)
        shutil.rmtree(work, ignore_errors=True)
    attach_logs(states, rank_logs, rank_offsets, "\n".join(_agent_log(a) for a in agents))
    combined = combine(states, time.monotonic() - start)
    if combined.outcome == "failed":
        combined.message += " " + _whereabouts(combined.failure_kind, states, where, agents, exits, hosts)
    return combined


def _await_ready(agents: list[_Agent], work: Path, world: int, limit_s: float) -> bool:
    """Until every rank is in its test (True), or an agent ended or the limit passed (False)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all((work / f"rank{rank}.ready").exists() for rank in range(world)):
            return True
        if [a for a in agents if a.proc.poll() is not None]:
            return False
        time.sleep(0.1)
    return False


def _await_end(agents: list[_Agent], deadline: float) -> bool:
    """Until every agent exited (False) or the deadline (True: timed out). An agent that
    failed gives the others FAILURE_GRACE_S to finish, as a pool rank's failure does."""
    while [a for a in agents if a.proc.poll() is None]:  # every agent polled: `any` would stop at the first
        now = time.monotonic()
        if any(a.proc.returncode for a in agents if a.proc.returncode is not None):
            deadline = min(deadline, now + FAILURE_GRACE_S)
        if now >= deadline:
            return True
        time.sleep(0.1)
    return False


def _rank_nodes(agents: list[_Agent], work: Path, world: int) -> dict[int, _Agent]:
    """Which agent each started rank runs under, read while they all live: c10d numbers
    nodes by join order, so it is read off the process tree, never assumed."""
    trees = {id(a): set(procs.descendants(a.proc.pid)) for a in agents}
    where: dict[int, _Agent] = {}
    for rank in range(world):
        try:
            pid = int((work / f"rank{rank}.pid").read_text())
        except (OSError, ValueError):
            continue
        where.update((rank, a) for a in agents if pid in trees[id(a)])
    return where


def _agent_log(agent: _Agent) -> str:
    try:
        with open(agent.log_path, "rb") as fh:
            fh.seek(agent.offset)
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _not_started(agents: list[_Agent], work: Path, world: int, where: dict[int, _Agent], topology: Topology,
                 hosts: Hosts, duration_s: float) -> Combined:
    """The launch never got every rank into its test: `infra`. With c10d no rank starts
    before every node joined, so no rank at all means a node never joined: named as the
    agents that gave up and the nodes that cannot be reached."""
    for a in agents:
        if a.proc.poll() is None:
            procs.kill_tree(a.proc)
    shutil.rmtree(work, ignore_errors=True)
    tails = "\n".join(f"--- {a.node.hostname} agent ---\n{_agent_log(a)[-3000:]}" for a in agents)
    if where:
        message = (f"ranks started on {len({id(a) for a in where.values()})} node(s) but not all got into the test "
                   "(a rank failed at start-up); see the agents' logs")
        return Combined("error", "infra", "RanksFailedToStart", f"{message}\n{tails}", f"RanksFailedToStart"[:300],
                        duration_s=duration_s)
    missing = [a for a in agents if not _reachable(hosts, a.node)]
    missing += [a for a in agents if a not in missing and a.proc.returncode not in (None, -signal.SIGKILL)]
    names = ", ".join(f"{a.node.hostname} ({a.node.address})" for a in missing) or "not identified (every agent waited)"
    message = (f"node(s) never joined the rendezvous at {topology.endpoint}: {names}; check the node is up and "
               "reaches the first node")
    return Combined("error", "infra", "NodeNeverJoined", f"{message}\n{tails}",
                    f"NodeNeverJoined: {names}"[:300], duration_s=duration_s)


def _whereabouts(kind: str | None, states: list, where: dict[int, _Agent], agents: list[_Agent],
                 exits: dict[str, int | None], hosts: Hosts) -> str:
    """Which nodes the failure is on, in words: the agents that died (a crash), the nodes
    of the stuck ranks, the nodes whose link is down."""
    parts = []
    if kind == "crash":
        for a in agents:
            code = exits.get(a.node.hostname)
            if code and any(s.report is None and where.get(s.rank) is a for s in states):
                ranks = sorted(r for r, ag in where.items() if ag is a)
                parts.append(f"on node {a.node.hostname}: its agent {describe_exit(code)} (rank(s) "
                             f"{', '.join(map(str, ranks))})")
    stuck = sorted({where[s.rank].node.hostname for s in states if s.stuck and s.rank in where})
    if stuck:
        parts.append(f"stuck on node(s) {', '.join(stuck)}")
    down = [a.node.hostname for a in agents if not _reachable(hosts, a.node)]
    if down:
        parts.append(f"node(s) {', '.join(down)} unreachable (link down)")
    return f"[{'; '.join(parts)}]" if parts else ""


def _reachable(hosts: Hosts, node: Node) -> bool:
    try:
        return hosts.reachable(node)
    except Exception:  # noqa: BLE001 - a cluster that cannot say is taken as reachable
        return True


@dataclass
class AgentExit:
    """One node's agent after `run_program`: how it ended and what it printed."""

    hostname: str
    returncode: int | None
    output: str


def run_program(hosts: Hosts, topology: Topology, program: list[str], *, timeout_s: float = 300.0,
                python: str = sys.executable, env: dict[str, str] | None = None) -> list[AgentExit]:
    """Run `program` (`-m module ...`) on every rank of `topology`, one agent per node, and
    return each agent's exit and output (the placement check and the bench use it)."""
    token = procs.run_token()
    command = agent_command(topology, program, run_id=uuid.uuid4().hex[:12], python=python)
    started = []
    with tempfile.TemporaryDirectory(prefix="distci-agents-") as tmp:
        try:
            for node in topology.nodes:
                out = open(Path(tmp) / f"{node.hostname}.out", "wb")
                node_env = dict(os.environ, **(env or {}), **hosts.environment(node))
                started.append((node, out, procs.start_owned([*hosts.exec_prefix(node), *command], env=node_env,
                                                             token=token, stdout=out, stderr=subprocess.STDOUT,
                                                             stdin=subprocess.DEVNULL)))
            deadline = time.monotonic() + timeout_s
            for _node, _out, proc in started:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            ended = [proc.poll() for _node, _out, proc in started]  # None: still running at the timeout
        finally:
            for _node, out, proc in started:
                procs.kill_tree(proc)
                out.close()
        return [AgentExit(node.hostname, code, (Path(tmp) / f"{node.hostname}.out").read_text(errors="replace"))
                for (node, _out, _proc), code in zip(started, ended)]
