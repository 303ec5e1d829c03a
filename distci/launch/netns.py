"""Hosts simulated on one machine with Linux network namespaces: the tier CI runs.

Each node is a network namespace of its own (`distci-<tag>-n<k>`) with one interface,
`eth0`, at 198.18.0.<k+1>/24 (RFC 2544's benchmarking range: never routed), its own
hostname (a UTS namespace per agent, `unshare --uts`) and an /etc/hosts naming every node
(a mount namespace per agent with /etc/netns/<ns>/hosts bound over /etc/hosts). Agents
enter the node with `nsenter --net`, not `ip netns exec`: that one remounts /sys, which
hides the cgroup hierarchy a Slurm daemon on the node needs. The nodes' veths meet on a
bridge that lives in a namespace of its own too (`distci-<tag>-sw`), so nothing of the
run touches the host's network: no address, route or NAT on the host, and the host's
firewall never sees the bridged traffic.

Everything carries the `distci-` prefix and is removed by `destroy()` (the context's
exit, SIGTERM/SIGINT/SIGHUP, interpreter exit) or, after a SIGKILL, by `teardown()`,
which removes every namespace of that prefix and kills what still runs in it.
Linux and root only; `unavailable()` says why not, for a skip with a reason.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Any

from distci.errors import InfraError
from distci.harness import procs
from distci.launch.topology import RDZV_PORT, Node, Topology

PREFIX = "distci-"
SUBNET = "198.18.0"
IFNAME = "eth0"
ETC_NETNS = Path("/etc/netns")  # where each node's hosts file lives (`ip netns` keeps per-namespace /etc here)
NETNS_DIR = Path("/run/netns")  # where `ip netns add` pins the namespaces
COMMAND_TIMEOUT_S = 30.0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InfraError(f"`ip {' '.join(args)}` failed: {exc}") from None
    if check and done.returncode != 0:
        raise InfraError(f"`ip {' '.join(args)}` failed: {done.stderr.strip() or done.returncode}")
    return done


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can): for skips and clear errors."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "simulated hosts need root (network namespaces, a bridge and veths)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"simulated hosts need `{tool}` (iproute2 / util-linux)"
    probe = f"{PREFIX}probe-{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not allowed here: {made.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return None


def namespaces(prefix: str = PREFIX) -> list[str]:
    """The network namespaces whose names start with `prefix`."""
    listed = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(prefix)]


def pids_in(namespace: str) -> list[int]:
    """The processes inside a namespace (what would be left running on that node)."""
    out = _ip("netns", "pids", namespace, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _owner_alive(name: str) -> bool:
    """Is the process that made this namespace's hosts still running? (Its pid is in the
    hosts' /etc/netns/<ns>/owner; a namespace without one has no live owner.)"""
    try:
        pid = int((ETC_NETNS / name / "owner").read_text())
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}").exists()  # namespaces are Linux-only, and so is this


def teardown(prefix: str = PREFIX, *, force: bool = False) -> list[str]:
    """Remove the namespaces of `prefix` whose run is gone (all of them with `force`), with
    their bridge and veths, killing what still runs inside, and their /etc/netns files;
    returns the namespaces removed. What a run killed by SIGKILL left goes this way
    (`python -m distci hosts-teardown`); a run still going keeps its hosts."""
    removed = []
    for name in namespaces(prefix):
        if not force and _owner_alive(name):
            continue
        procs.kill_pids(pids_in(name))
        _ip("netns", "delete", name, check=False)
        shutil.rmtree(ETC_NETNS / name, ignore_errors=True)
        removed.append(name)
    if ETC_NETNS.is_dir():
        for leftover in ETC_NETNS.glob(f"{prefix}*"):
            if force or not _owner_alive(leftover.name):
                shutil.rmtree(leftover, ignore_errors=True)
    return removed


class SimulatedHosts:
    """`count` simulated nodes for the life of a `with` block (or create()/destroy())."""

    def __init__(self, count: int, *, tag: str | None = None) -> None:
        if count < 1:
            raise ValueError(f"a simulated cluster needs at least one node, got {count}")
        if count > 250:
            raise ValueError(f"{count} nodes do not fit {SUBNET}.0/24; use at most 250")
        self.tag = tag or uuid.uuid4().hex[:6]
        self.prefix = f"{PREFIX}{self.tag}-"
        self.nodes = tuple(Node(k, f"node{k}", f"{SUBNET}.{k + 1}") for k in range(count))
        self.switch = f"{self.prefix}sw"
        self._created = False
        self._saved: dict[int, Any] = {}

    def namespace(self, node: Node) -> str:
        return f"{self.prefix}n{node.index}"

    def topology(self, ranks_per_node: int, port: int = RDZV_PORT) -> Topology:
        return Topology(self.nodes, ranks_per_node, port)

    # -- life ------------------------------------------------------------------------
    def create(self) -> "SimulatedHosts":
        reason = unavailable()
        if reason:
            raise InfraError(reason)
        self._created = True  # from the first command on, destroy() has something to remove
        atexit.register(self.destroy)
        self._take_signals()
        try:
            # Owned before it exists: a `teardown` running beside this (another run's, a test's)
            # removes namespaces without a live owner, and would take one caught in between.
            self._own(self.switch)
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "set", "lo", "up")
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            hosts = "127.0.0.1 localhost\n" + "".join(f"{n.address} {n.hostname}\n" for n in self.nodes)
            for node in self.nodes:
                ns, port = self.namespace(node), f"v{node.index}"
                self._own(ns)
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", IFNAME, "netns", ns)
                _ip("-n", self.switch, "link", "set", port, "master", "br0")
                _ip("-n", self.switch, "link", "set", port, "up")
                _ip("-n", ns, "addr", "add", f"{node.address}/24", "dev", IFNAME)
                _ip("-n", ns, "link", "set", IFNAME, "up")
                etc = ETC_NETNS / ns
                (etc / "hosts").write_text(hosts)
                (etc / "hostname").write_text(node.hostname + "\n")
        except BaseException:
            self.destroy()
            raise
        return self

    @staticmethod
    def _own(name: str) -> None:
        """Mark the namespace as this process's: `teardown` leaves it while this process lives."""
        etc = ETC_NETNS / name
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "owner").write_text(str(os.getpid()))

    def destroy(self) -> None:
        """Kill what runs on the nodes and remove the namespaces, bridge and veths (idempotent)."""
        if not self._created:
            return
        self._created = False
        teardown(self.prefix, force=True)
        self._release_signals()
        atexit.unregister(self.destroy)

    def __enter__(self) -> "SimulatedHosts":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def _take_signals(self) -> None:
        """On SIGTERM/SIGINT/SIGHUP: remove the hosts, then do what the signal did before."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._saved[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        previous = self._saved.get(signum, signal.SIG_DFL)
        self.destroy()
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def _release_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            self._saved.clear()
            return
        for sig, handler in self._saved.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, handler)
        self._saved.clear()

    # -- on a node --------------------------------------------------------------------
    def exec_prefix(self, node: Node) -> list[str]:
        """Prefix a command with this to run it on `node`: its namespace and hostname.
        Every step execs, so the started process IS the command (its pid, its signals)."""
        hosts = ETC_NETNS / self.namespace(node) / "hosts"
        return ["nsenter", f"--net={NETNS_DIR / self.namespace(node)}", "unshare", "--uts", "--mount", "--",
                "sh", "-c", 'mount --bind "$1" /etc/hosts && hostname "$0" && shift && exec "$@"',
                node.hostname, str(hosts)]

    def environment(self, node: Node) -> dict[str, str]:
        """What a node's agent and ranks are told about the network: gloo uses `eth0`."""
        return {"GLOO_SOCKET_IFNAME": IFNAME, "DISTCI_NODE": node.hostname}

    def link(self, node: Node, up: bool) -> None:
        """Take the node's only link down (a cable pulled mid-collective) or bring it back."""
        _ip("-n", self.namespace(node), "link", "set", IFNAME, "up" if up else "down")

    def reachable(self, node: Node) -> bool:
        """Is the node's link up (what a cluster's health check would say of the host)?"""
        shown = _ip("-n", self.namespace(node), "-o", "link", "show", IFNAME, check=False).stdout
        flags = shown.split("<", 1)[-1].split(">", 1)[0].split(",") if "<" in shown else []
        return "UP" in flags

    def slow_link(self, node: Node, delay_ms: int = 40, rate: str = "8mbit") -> str:
        """Slow the node's link with `tc`: netem's delay where the kernel has sch_netem, else
        tbf's rate limit (every packet queued behind a token bucket; kernels built without
        netem, as some CI VMs are). Returns the qdisc it set, for the test's record."""
        if shutil.which("tc") is None:
            raise InfraError("`tc` (iproute2) is not installed: cannot slow a link")
        tried = []
        for qdisc in (["netem", "delay", f"{delay_ms}ms", f"{max(1, delay_ms // 4)}ms"],
                      ["tbf", "rate", rate, "burst", "32kbit", "latency", f"{max(50, delay_ms * 10)}ms"]):
            cmd = ["ip", "netns", "exec", self.namespace(node), "tc", "qdisc", "replace", "dev", IFNAME, "root", *qdisc]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
            if done.returncode == 0:
                return " ".join(qdisc)
            tried.append(f"{qdisc[0]}: {done.stderr.strip()}")
        raise InfraError(f"cannot slow {node.hostname}'s link: {'; '.join(tried)}")

    def leftovers(self) -> dict[str, list[int]]:
        """Processes still running on each node (hostname -> pids), for "nothing left running"."""
        return {n.hostname: pids for n in self.nodes if (pids := pids_in(self.namespace(n)))}
