"""The one place that starts, watches and kills the process trees a run causes.

Three mechanisms, because each one alone leaves something running:
- parent-death signals (`die_with_parent`): a rank worker, a torchrun agent and each of
  its ranks get SIGKILL from the kernel the moment their parent dies, however it died;
- child subreapers (`become_subreaper`): a rank adopts its orphaned descendants (a
  daemon, a `start_new_session=True` grandchild whose parent exited), so walking the
  rank's tree (`descendants`) finds them and they die with the test;
- the run token (`RUN_TOKEN_ENV`) in every process's environment, and a reaper
  (`Reaper`) that outlives the controller just long enough to kill every process still
  carrying the token: the only mechanism that reaches a setsid grandchild whose rank
  was SIGKILLed (nothing else is left to adopt it).

Linux only where it matters (prctl, /proc); elsewhere the calls are no-ops.

Why /proc by hand and not psutil: this module runs inside every cell env (the rank
workers), and psutil would be one more wheel in every stack's wheelhouse and a hard
requirement on a preinstalled stack without network (docs/installed-stack.md), for code
that is Linux-only anyway. Measured with psutil 7.2.2 on the 2-core machine (166
processes, load ~20): the tree walk 26.8 ms (psutil's children(recursive=True) 10.6 ms),
the token scan 14.5 ms (psutil's process_iter + environ() 42.7 ms): once per test, either
is far inside the harness's per-test budget. (/proc/PID/task/TID/children, which would
avoid reading every stat file, is not there on every kernel: absent on that machine.)
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

RUN_TOKEN_ENV = "DISTCI_RUN_TOKEN"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent thread dies."""
    return _prctl(PR_SET_PDEATHSIG, int(sig))


def become_subreaper() -> bool:
    """Orphaned descendants of this process are re-parented to it instead of to init."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def keep_tree(close_fds: tuple[int, ...] = ()) -> None:
    """Splits this process in two: the child returns from this call and goes on; this process
    stays behind as the keeper of the child's tree and never returns. The keeper is a child
    subreaper, so whatever the child's tree leaves orphaned (a daemon in a session of its
    own, with its environment cleared: no run token finds it) is re-parented to it, even when
    the child itself dies (killed by a test, or by the OOM killer). When the child ends, the
    keeper kills everything left under it and ends the way the child did (the same exit code
    or signal), so its parent sees the child's death as the keeper's. `close_fds` are the
    child's channels, closed in the keeper so the child's death closes them."""
    become_subreaper()
    die_with_parent()
    pid = os.fork()
    if pid == 0:
        die_with_parent()  # the keeper now
        return
    try:
        _keep(pid, close_fds)
    finally:  # the keeper never returns into its caller's code, whatever happened
        os._exit(70)


def _keep(pid: int, close_fds: tuple[int, ...]) -> None:
    """The keeper's life (see keep_tree): reap until `pid` ends, kill what is left, end as it did."""
    for fd in close_fds:
        os.close(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the controller stops the tree by killing it
    signal.signal(signal.SIGUSR1, lambda *_: os.kill(pid, signal.SIGUSR1))  # stack dumps are the child's
    status = 0
    while True:
        try:
            got, found = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if got == pid:
            status = found
            break
    kill_descendants(os.getpid())
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)  # a signal the default action ignores: fall through
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 70)


def _owned_child(death_signal: int = signal.SIGKILL) -> None:  # preexec_fn: in the child, before exec
    os.setsid()
    # A controller started with SIGINT ignored (a background job of a non-interactive
    # shell) must still be able to stop its child with SIGINT: default dispositions.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    die_with_parent(death_signal)


def run_token() -> str:
    """A new token for this run. A caller that wants to check for leftovers sets
    DISTCI_RUN_TOKEN=T for the controller; the run's token is then `T.<new>`, which
    `with_token(T, prefix=True)` finds, while the reaper kills only what carries `T.<new>`:
    never other processes that happen to carry T (a shell that exported it)."""
    fresh = uuid.uuid4().hex
    inherited = os.environ.get(RUN_TOKEN_ENV)
    return f"{inherited}.{fresh}" if inherited else fresh


def start_owned(cmd: list[str], *, env: dict[str, str], token: str, death_signal: int = signal.SIGKILL,
                **kwargs) -> subprocess.Popen:
    """Start a process tree the run owns: own session (a Ctrl-C at the terminal reaches the
    controller only, which then stops the tree in order), sent `death_signal` by the kernel
    if the controller dies, carrying the run token."""
    env = dict(env, **{RUN_TOKEN_ENV: token})
    return subprocess.Popen(cmd, env=env, preexec_fn=lambda: _owned_child(death_signal), **kwargs)


class stop_signals_raise:
    """Within this block SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt, so one handler
    stops the child in order (main thread only; elsewhere a no-op). SIGINT is set here
    too: a process started with SIGINT ignored (a background job of a non-interactive
    shell, as some CI wrappers launch) would otherwise never see Ctrl-C or a cancel.

    Only the first stop raises: the same stop often arrives twice (a terminal's Ctrl-C
    reaches the whole foreground group, and nox hands it on as well; a CI cancel follows
    SIGINT with SIGTERM), and a second KeyboardInterrupt inside the closing would leave
    the run without its summary, JUnit and end time."""

    def __enter__(self) -> "stop_signals_raise":
        import threading

        self._saved: dict[int, object] = {}
        self.stopped_by: str | None = None
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._saved[sig] = signal.signal(sig, self._raise)
        return self

    def _raise(self, signum: int, _frame) -> None:
        if self.stopped_by is not None:
            print(f"distci: {signal.Signals(signum).name} while stopping ({self.stopped_by}): "
                  "still closing the run", file=sys.stderr, flush=True)
            return
        self.stopped_by = signal.Signals(signum).name
        raise KeyboardInterrupt(self.stopped_by)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


def stop(proc: subprocess.Popen, sig: int = signal.SIGINT, grace_s: float = 60.0) -> int:
    """Ask a child to stop (it records where it stopped), then kill its tree if it lingers."""
    try:
        proc.send_signal(sig)
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        return proc.returncode


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def cpu_seconds(pids: list[int], *, reaped: bool = False) -> float:
    """CPU time (user + system) used so far by `pids` and everything under them; with `reaped`,
    also what their children that already exited and were waited for used (the whole tree's cost,
    as tests/cpu_time.py charges a test)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for pid in {p for root in pids for p in (root, *descendants(root))}:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
        except (OSError, IndexError, ValueError):
            continue
    return total / tick


def cpu_advancing(pids: list[int], window_s: float = 1.0) -> dict[int, bool]:
    """Per pid: did it (or its tree) use CPU time during `window_s`? Each is read in turn, so a
    process that gets a slice every few hundred ms on a saturated machine still shows."""
    before = {pid: cpu_seconds([pid]) for pid in pids}
    time.sleep(window_s)
    return {pid: cpu_seconds([pid]) > before[pid] for pid in pids}


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (from /proc), children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            ppid = _ppid(int(entry.name))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def with_token(token: str, exclude: set[int] = frozenset(), *,  # type: ignore[assignment]
               prefix: bool = False) -> list[int]:
    """PIDs whose environment carries `token` (with `prefix`, also a run token made from it).
    A process in the middle of its exec shows an empty environment for a moment (Popen has
    returned by then): one scan can miss it, so a sweep scans until it finds none several
    times (`reap_token`)."""
    needle = f"{RUN_TOKEN_ENV}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            if needle in env or (prefix and any(v.startswith(needle + b".") for v in env)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def pidfd(pid: int) -> int | None:
    """A pidfd of `pid` (readable once it ended), or None where the kernel or Python has none."""
    try:
        return os.pidfd_open(pid)  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        return None


def exit_code(status: int) -> int:
    """A wait status as Popen.returncode words it (negative: the signal)."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def has_children() -> bool:
    """Does this process have a child (alive, or dead and not yet reaped: reaped here)? Without
    reading /proc: a subreaper with no child has nothing under it at all, which is what most
    tests leave, so the tree walk (tens of ms on a loaded runner) is skipped then."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def kill_descendants(pid: int, keep: set[int] = frozenset()) -> list[int]:  # type: ignore[assignment]
    """SIGKILL everything under `pid` except `keep`; returns what was killed. Called on
    this process's own tree, it also reaps the dead (a subreaper inherits them as zombies)."""
    if pid == os.getpid() and not keep and not has_children():
        return []
    doomed = [p for p in descendants(pid) if p not in keep]
    kill_pids(doomed)
    if pid == os.getpid():
        _reap(doomed)
    return doomed


def _reap(pids: list[int], settle_s: float = 1.0) -> None:
    """Waits for those of `pids` that are (or, orphaned, become) this process's children."""
    pending = set(pids)
    deadline = time.monotonic() + settle_s
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    pending.discard(pid)
            except ChildProcessError:
                if not Path(f"/proc/{pid}").exists():
                    pending.discard(pid)
        if pending:
            time.sleep(0.02)


def _pgrp(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal the process group `proc` leads (started with start_new_session=True or
    process_group=0), never a stranger's. A waited-for child's pid is free for reuse (pid_max
    is 32768 on many runners, and a test suite wraps it), and a reused number that leads a
    group of its own would take `killpg(proc.pid)`: so only an unreaped child is signalled
    by number; after the wait, the group's members still alive are signalled one by one (the
    kernel keeps the number while any member lives, so a live process with that pid means
    the group is gone and the number is someone else's)."""
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        return
    members = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit() and _pgrp(int(e.name)) == proc.pid]
    if proc.pid in members:
        return
    for pid in members:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launch, its process group and every descendant (whatever session it is
    in). After the launch was waited for, its pid may be another's: only its group's
    survivors are left to kill then (`kill_group`)."""
    if proc.returncode is None:
        for pid in descendants(proc.pid):
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            proc.kill()
        except ProcessLookupError:
            pass
    kill_group(proc)
    proc.wait()


def reap_token(token: str, exclude: set[int], settle_s: float = 10.0) -> None:
    """Kill every process carrying `token` until none is left (or `settle_s` passes)."""
    deadline = time.monotonic() + settle_s
    quiet = 0
    while time.monotonic() < deadline and quiet < 3:
        pids = with_token(token, exclude)
        kill_pids(pids)
        quiet = 0 if pids else quiet + 1
        time.sleep(0.1)


class Reaper:
    """A small process that kills every token-carrying process once the controller is gone.

    It holds the read end of a pipe whose write end only the controller has: end of file
    means the controller ended (normally, or by any signal, SIGKILL included). `close()`
    is the normal end: the reaper then sweeps once more and exits.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        read_fd, self._write_fd = os.pipe()
        env = {k: v for k, v in os.environ.items() if k != RUN_TOKEN_ENV}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distci.harness.procs", token, str(os.getpid()), str(read_fd)],
            env=env, pass_fds=(read_fd,), start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(read_fd)

    def close(self, timeout_s: float = 15.0) -> None:
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def ancestors(pid: int) -> set[int]:
    """`pid` and every process above it."""
    found: set[int] = set()
    while pid > 1 and pid not in found:
        found.add(pid)
        pid = _ppid(pid) or 0
    return found


def _reaper_main(token: str, controller: int, fd: int) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # The controller and whatever started it may carry the token too (a caller sets it
    # to check for leftovers); those are not ours to kill.
    spared = ancestors(os.getpid())
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready and not os.read(fd, 64):
            break
        if _ppid(os.getpid()) != controller and not Path(f"/proc/{controller}").exists():
            break
    reap_token(token, spared)
    return 0


if __name__ == "__main__":
    sys.exit(_reaper_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
