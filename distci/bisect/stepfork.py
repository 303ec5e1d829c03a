"""A compiler bisect's steps forked from one interpreter that imported torch.

Every step of `distci bisect --compiler` runs the user's command anew (compiler.py): the
bisector hands a step its state through the environment and files, and nothing one step
does may reach the next. For the usual command, `python SCRIPT [ARGS]`, nearly all of a
step was that interpreter importing torch, Dynamo and inductor (4.8 of ~5 CPU-s). So the
bisect starts one **step template** (`python -m distci.bisect.stepfork`, the failing
environment's interpreter, the steps' shared environment, the shim on PYTHONPATH): it
imports those modules and runs nothing else (no compile, no thread of its own), then forks
one child per step. The child takes the step's environment, working directory, output
file and argv, and runs the script as `__main__` the way `python SCRIPT` does (its
directory first on sys.path, atexit handlers at the end, an uncaught exception printed
and exit 1).

Why a forked step is as fresh as a new process, for what the bisect depends on:
- the template never compiled: Dynamo's and inductor's caches, the bisector's counters of
  subsystem applications and its temporary state are empty in every fork (`unfit` checks
  the bisector's before the template serves, and it refuses to serve when they are not);
- only the per-step variables (`--per-step`: the bisector's TORCH_BISECT_*, the backend,
  the shim's mode) may differ from the template's environment; a step whose environment
  differs in anything else runs as a fresh process, since torch reads many variables at
  import;
- what torch computed from the per-step variables at import is computed again in the
  child once its environment is set: the bisector's cached reads of TORCH_BISECT_*
  (`get_env_val`) and `bisection_enabled` (`fresh_bisector_state`), and the shim's patch of
  `torch.compile` for the step's mode, which the template imported with no mode;
- what a step does (monkeypatches, compiled code, threads) dies with its fork.
tests/test_bisect_stepfork.py runs a probe forked and fresh under the same environments and
compares what each sees. What a fork shares with its template that a new process would not
draw anew: the hash seed and the address layout. So the honesty contract's fresh runs (the
confirmation, compiler.py `drive`) stay new processes: a failure that depends on them
shows there.

Both sides import only the standard library and distci.harness.procs (the template torch
too): the template runs in the failing environment, on distci's probe wheel.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import random
import re
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Mapping, Sequence

from distci.harness import procs

IMPORTS = ("torch", "torch._dynamo", "torch._inductor.compile_fx", "torch._inductor.compiler_bisector")
"""What the template imports ahead: what every compiling step imports. The bisector's
module is among them on purpose: it reads TORCH_BISECT_* at import, so every fork redoes
that (`fresh_bisector_state`), on every torch, and the test of a fork's freshness sees it."""
PYTHON_NAME = re.compile(r"python(3(\.\d+)?)?")
PLAIN = re.compile(r"[\w./:=,+@%-]+")
"""A word the template runs as written: no quoting, expansion or redirection for a shell."""
READY_S = 900.0
"""How long the template may take to import (a loaded runner's torch import takes minutes)."""


def forkable(command: str | Sequence[str]) -> list[str] | None:
    """`command`'s argv when it is `python SCRIPT [ARGS]` with plain words (a string, or the
    driver's `sh -c STRING`), else None: what only a shell or another program can run."""
    if not isinstance(command, str):
        command = command[2] if len(command) == 3 and list(command[:2]) == ["sh", "-c"] else ""
    words = command.split()
    if len(words) < 2 or not all(PLAIN.fullmatch(word) for word in words):
        return None
    if not PYTHON_NAME.fullmatch(words[0]) or words[1].startswith("-"):
        return None
    return words


class Template:
    """The bisect's handle on its step template: start it, wait until it serves, stop it."""

    def __init__(self, proc: subprocess.Popen, socket_path: Path, log_path: Path) -> None:
        self.proc, self.socket_path, self.log_path = proc, socket_path, log_path

    @classmethod
    def start(cls, python: str, env: Mapping[str, str], cwd, directory: Path, *,
              per_step: Sequence[str], shim_env: str) -> "Template":
        """Start the template with the steps' environment less the per-step variables."""
        socket_path, log_path = directory / "steps.sock", directory / "steps.log"
        argv = [python, "-m", "distci.bisect.stepfork", "--socket", str(socket_path), "--shim-env", shim_env]
        for name in per_step:
            argv += ["--per-step", name]
        base = {k: v for k, v in env.items() if k not in per_step}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, cwd=cwd, env=base, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=procs.die_with_parent)
        return cls(proc, socket_path, log_path)

    def ready(self, timeout: float = READY_S) -> str | None:
        """None once the template serves; else why it does not (its log's last line)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                lines = self.log_path.read_text(errors="replace").strip().splitlines()
                return lines[-1] if lines else f"it exited {self.proc.returncode}"
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(str(self.socket_path))
                return None
            except OSError:
                time.sleep(0.05)
        self.stop()
        return f"it did not serve within {timeout:.0f} s"

    def stop(self) -> None:
        procs.kill_group(self.proc)
        self.proc.wait()


def run(socket_path: str | Path, argv: list[str], cwd, env: Mapping[str, str], timeout: float | None,
        out: str | Path) -> int | None:
    """Run `argv` (from `forkable`) as a fork of the template at `socket_path`, its output
    in the file `out`; its exit code (124: timed out), or None when the template refuses it
    (the caller runs it as a new process)."""
    request = {"argv": argv, "cwd": os.path.abspath(cwd or os.getcwd()), "env": dict(env),
               "timeout": timeout, "out": str(out)}
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(socket_path))
            conn.sendall(json.dumps(request).encode() + b"\n")
            reply = json.loads(_read_line(conn))
    except (OSError, ValueError):
        return None
    return reply.get("code")


def _read_line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


# -- the template ----------------------------------------------------------------------------


def unfit(shim_env: str) -> str | None:
    """Why forks of this process would not start as fresh steps, or None."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} threads run in the template"
    cb = sys.modules.get("torch._inductor.compiler_bisector")
    if cb is not None:
        if not hasattr(getattr(cb, "get_env_val", None), "cache_clear") or not hasattr(cb, "get_is_bisection_enabled"):
            return "this torch's compiler bisector reads its environment in a way a fork cannot redo"
        if any(getattr(cb, "subsystem_call_counter", {}).values()) or cb.CompilerBisector.in_process_cache:
            return "the compiler bisector's state is not empty after the imports"
    if shim_env and not callable(getattr(sys.modules.get("sitecustomize"), "_patch", None)):
        return "the compiler shim's sitecustomize is not the one imported"
    return None


def fresh_bisector_state() -> None:
    """Redo what the bisector computed from TORCH_BISECT_* when it was imported."""
    cb = sys.modules.get("torch._inductor.compiler_bisector")
    if cb is not None:
        cb.get_env_val.cache_clear()
        cb.CompilerBisector.bisection_enabled = cb.get_is_bisection_enabled()


def refusal(request: dict, started: Mapping[str, str], per_step: Sequence[str]) -> str | None:
    """Why this request must run as a new process, or None."""
    env = request["env"]
    differs = sorted(k for k in set(env) | set(started) if k not in per_step and env.get(k) != started.get(k))
    if differs:
        return f"its environment differs from the template's in {', '.join(differs[:3])}"
    found = shutil.which(request["argv"][0], path=env.get("PATH"))
    if not found or os.path.dirname(os.path.abspath(found)) != os.path.dirname(os.path.abspath(sys.executable)):
        return f"{request['argv'][0]} is not the template's interpreter ({sys.executable})"
    if not os.path.isfile(os.path.join(request["cwd"], request["argv"][1])):
        return f"{request['argv'][1]} is not a file"
    return None


def serve(listener: socket.socket, started: Mapping[str, str], added: Mapping[str, str],
          per_step: Sequence[str], shim_env: str) -> None:
    """Answer requests one at a time, for as long as the bisect lives."""
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                request = json.loads(_read_line(conn))
            except ValueError:  # `Template.ready`'s probe, or a client that went away
                continue
            why = refusal(request, started, per_step)
            if why:
                print(f"stepfork: runs anew: {why}", flush=True)
                reply: dict = {"code": None, "refused": why}
            else:
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _step(request, added, shim_env, (listener.fileno(), conn.fileno()))
                reply = {"code": _wait(pid, request.get("timeout"))}
            conn.sendall(json.dumps(reply).encode() + b"\n")


def _wait(pid: int, timeout: float | None) -> int:
    """The step's exit code as `sh -c` reports it (128 + N for signal N; 124: timed out);
    what it left running in its session is killed."""
    deadline = time.monotonic() + timeout if timeout else None
    timed_out = False
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if deadline and not timed_out and time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            timed_out = True
        time.sleep(0.02)
    try:
        os.killpg(pid, signal.SIGKILL)  # the exited step still holds its number: its group is its own
    except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return 124
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _step(request: dict, added: Mapping[str, str], shim_env: str, fds: tuple[int, ...]) -> None:
    """In the fork: become the step, run its script, exit. Never returns."""
    code = 70
    try:
        os.setsid()
        procs.die_with_parent()
        for fd in fds:
            os.close(fd)
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({**added, **request["env"]})
        random.seed()
        fresh_bisector_state()
        shim = sys.modules.get("sitecustomize")
        if shim_env and shim is not None:
            shim._patch(sys.modules["torch"], os.environ.get(shim_env, ""))
        script, args = request["argv"][1], request["argv"][2:]
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        code = run_main(script)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def run_main(script: str) -> int:
    """Run `script` as `__main__` and end as the interpreter would: its exit code."""
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = (exc.code or 0) & 0xFF
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    shutdown: Callable[[], None] | None = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distci.bisect.stepfork")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--per-step", action="append", default=[])
    parser.add_argument("--shim-env", default="")
    args = parser.parse_args(argv)
    started = dict(os.environ)
    for name in IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            print(f"stepfork: not serving: {name} does not import ({exc})", flush=True)
            return 3
    why = unfit(args.shim_env)
    if why:
        print(f"stepfork: not serving: {why}", flush=True)
        return 3
    added = {k: v for k, v in os.environ.items() if started.get(k) != v}
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(args.socket)
    listener.listen(1)
    print(f"stepfork: serving at {Path(args.socket).name} (imported {', '.join(IMPORTS)})", flush=True)
    serve(listener, started, added, args.per_step, args.shim_env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
