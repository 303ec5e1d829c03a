"""Hosts simulated with network namespaces: a cluster's view, and faults across nodes judged
as on one host (hang, infra, crash; a slow link is no failure), nothing left behind.

Root and `ip netns` only: elsewhere every test here skips with the reason. Each test makes
its own namespaces and removes them however it ends (the fixture's finally, checked)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distci.harness.protocol import TestRequest as Request
from distci.launch import netns
from distci.launch.agents import launch_across
from distci.launch.netns import SimulatedHosts

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
REASON = netns.unavailable() if sys.platform.startswith("linux") else "network namespaces are Linux only"
needs_netns = pytest.mark.skipif(REASON is not None, reason=str(REASON))


def request(name: str, timeout_s: float = 120.0) -> Request:
    return Request(nodeid=f"tests/launch_cases/nodes.py::{name}", module="launch_cases.nodes", qualname=name,
                       kwargs={}, sys_path=[str(TESTS)], timeout_s=timeout_s)


@pytest.fixture
def hosts():
    made = SimulatedHosts(2)
    try:
        with made:
            yield made
            assert made.leftovers() == {}, "processes left running on the nodes"
    finally:
        made.destroy()
        assert netns.namespaces(made.prefix) == [], "namespaces left behind"


def run(hosts: SimulatedHosts, name: str, tmp_path: Path, *, ranks_per_node: int = 1, timeout_s: float = 120.0,
        pg_timeout_s: float = 60.0, **kwargs):
    return launch_across(request(name, timeout_s), hosts, hosts.topology(ranks_per_node), "cpu", timeout_s,
                         tmp_path / "logs", owns_process_group=False, pg_timeout_s=pg_timeout_s, **kwargs)


@needs_netns
@pytest.mark.slow
def test_two_nodes_of_two_ranks_see_what_a_cluster_shows(hosts: SimulatedHosts, tmp_path: Path) -> None:
    combined = run(hosts, "cluster_view", tmp_path, ranks_per_node=2)
    assert combined.outcome == "passed", combined.render()
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("agent-*.log"))
    assert "--rdzv-backend=c10d" not in logs  # the agents' own output, not our command line
    assert {p.name for p in (tmp_path / "logs").glob("agent-*.log")} == {"agent-node0.log", "agent-node1.log"}


@needs_netns
@pytest.mark.slow
def test_a_link_down_mid_collective_is_a_hang_naming_the_node(hosts: SimulatedHosts, tmp_path: Path) -> None:
    def pull_the_cable(_agents: dict) -> None:
        time.sleep(2.0)
        hosts.link(hosts.nodes[1], up=False)

    combined = run(hosts, "collectives_for", tmp_path, timeout_s=25.0, pg_timeout_s=120.0, on_started=pull_the_cable)
    assert (combined.outcome, combined.failure_kind) == ("failed", "hang"), combined.render()
    assert "node1 unreachable (link down)" in combined.message, combined.message
    assert "stuck on node(s) node0, node1" in combined.message, combined.message
    for rank in combined.ranks:  # every rank's stack, in the collective it waits in
        assert rank.outcome == "stuck" and "all_reduce" in rank.excerpt, rank.excerpt[-2000:]


@needs_netns
@pytest.mark.slow
def test_a_node_that_never_joins_is_infra_naming_it(hosts: SimulatedHosts, tmp_path: Path) -> None:
    hosts.link(hosts.nodes[1], up=False)
    started = time.monotonic()
    combined = run(hosts, "a_few_collectives", tmp_path, join_timeout_s=15.0)
    assert (combined.outcome, combined.failure_kind, combined.exc_type) == ("error", "infra", "NodeNeverJoined"), \
        combined.render()
    assert "never joined the rendezvous at 198.18.0.1:29400: node1 (198.18.0.2)" in combined.message
    assert time.monotonic() - started < 90


@needs_netns
@pytest.mark.slow
def test_an_agent_killed_is_a_crash_on_its_node(hosts: SimulatedHosts, tmp_path: Path) -> None:
    def kill_node1(agents: dict) -> None:
        time.sleep(2.0)
        agents["node1"].send_signal(signal.SIGKILL)

    combined = run(hosts, "collectives_for", tmp_path, timeout_s=60.0, on_started=kill_node1)
    assert (combined.outcome, combined.failure_kind) == ("failed", "crash"), combined.render()
    assert "on node node1: its agent killed by SIGKILL (rank(s) " in combined.message, combined.message


@needs_netns
@pytest.mark.slow
@pytest.mark.skipif(not __import__("shutil").which("tc"), reason="`tc` (iproute2) is not installed")
def test_a_slow_link_does_not_turn_a_pass_into_a_fail(hosts: SimulatedHosts, tmp_path: Path) -> None:
    set_ = {hosts.slow_link(node, delay_ms=40) for node in hosts.nodes}
    assert set_ & {"netem delay 40ms 10ms", "tbf rate 8mbit burst 32kbit latency 400ms"}
    combined = run(hosts, "a_few_collectives", tmp_path)
    assert combined.outcome == "passed", f"with {set_}: {combined.render()}"


HOLDER = textwrap.dedent("""
    import sys, time
    from distci.launch.netns import SimulatedHosts
    hosts = SimulatedHosts(2, tag=sys.argv[1]).create()
    print("up", flush=True)
    time.sleep(60)
""")


@needs_netns
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_run_stopped_leaves_no_namespace(how: signal.Signals) -> None:
    """SIGTERM/SIGINT: the run removes its hosts itself; SIGKILL: `teardown` removes them by prefix."""
    tag = f"t{os.getpid() % 10000}{how.value}"
    prefix = f"{netns.PREFIX}{tag}-"
    # The run as a person starts it from a terminal: SIGINT at its default. A shell that runs
    # pytest in the background (`nox ... &` in a script) leaves SIGINT ignored for its children,
    # and a run started that way rightly goes on ignoring it.
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, tag], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        assert len(netns.namespaces(prefix)) == 3
        proc.send_signal(how)
        proc.wait(timeout=30)
        if how == signal.SIGKILL:
            left = netns.namespaces(prefix)
            assert len(left) == 3, "nothing can clean up after SIGKILL but teardown"
            assert set(left) <= set(netns.teardown()), "the dead run's hosts were kept"
        assert netns.namespaces(prefix) == []
        assert not list(netns.ETC_NETNS.glob(f"{prefix}*"))
    finally:
        proc.kill()
        proc.wait()
        netns.teardown(prefix)


@needs_netns
def test_teardown_leaves_the_hosts_of_a_run_still_going() -> None:
    with SimulatedHosts(1) as mine:
        netns.teardown()
        assert len(netns.namespaces(mine.prefix)) == 2, "teardown removed a live run's hosts"
        assert sorted(netns.teardown(mine.prefix, force=True)) == sorted([f"{mine.prefix}n0", f"{mine.prefix}sw"])
