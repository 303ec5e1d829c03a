"""Which part of torch.compile breaks a test: torch's compiler bisector, run from outside.

torch (>= 2.6) ships `torch._inductor.compiler_bisector.CompilerBisector`. Given a check
that passes or fails, it tries the compile backends in order (eager, aot_eager,
aot_eager_decomp_partition, its crossref variant, inductor) to find the first that
fails, then disables that backend's subsystems one by one (pre-grad passes, joint-graph
passes, post-grad passes, config changes such as fallback_random, lowerings, ...), and
for a subsystem applied many times binary-searches the application that breaks it. Its
answer is a BisectionResult: backend, subsystem, the bisect number, and debug info
naming the pass or op.

A distributed test runs in many processes, so the check here is a command run anew for
every step (torch 2.13's `compiler_bisector run` mode, which older releases lack): this
module's `main` is the driver, started with the failing environment's interpreter. It
runs `CompilerBisector.do_bisect` with a function that starts the command with the
state in environment variables and files under a private TORCHINDUCTOR_CACHE_DIR;
`torch.compile` in every process of the command, rank workers included, reads them and
swaps its backend and disables subsystems accordingly. The FX graph cache is bypassed
while the bisector is on, so a cached graph cannot hide a pass.

Every process of the command runs with a small sitecustomize (SHIM, on PYTHONPATH) that
hooks `import torch`:
- in the pre-check it swaps `torch.compile` for an identity, so the command runs its
  models eagerly. TORCH_COMPILE_DISABLE cannot serve: with it, a `fullgraph=True` compile
  raises ("found no compiled frames") and every fullgraph model, distci's scenarios
  included, would look broken without the compiler.
- while bisecting it keeps a custom backend callable (distci's scenarios count graphs with
  one that delegates to a named backend) and makes the backend it delegates to the one
  the bisector is trying; torch itself would replace the callable and lose the counts.
- when the identity run fails (the command may check that graphs were compiled), once
  more with every compile on the first backend the bisector would try (eager unless
  --compiler-backend says otherwise), custom backends keeping their counts.
A command that fails both ways is not the compiler's: the tool says so at once instead of
blaming Dynamo. One that fails with the identity only is bisected.

The command is first run as it is: its failure text is the *original failure*. Every step
keeps its own failure text (the finding's `steps`), and a step counts as failing only when
its failure has the original's signature (distci.bisect.checks.failure_signature); a step
that fails otherwise (another error, a crash under a backend the user does not run) is
read as "not this failure", so a backend is named only where the original failure is.

A command `python SCRIPT [ARGS]` (the usual repro) runs its steps as forks of one step
template that imported torch, Dynamo and inductor once (distci.bisect.stepfork, which says
why such a step is as fresh as a new process); the confirmation's fresh runs stay new
processes, and so does every step of any other command (a test id: pytest, torchrun).

The driver half imports only the standard library and torch: it runs inside cell
environments, torch 2.6 .. newest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

from distci.bisect.checks import failure_signature
from distci.bisect import stepfork
from distci.bisect.engine import CONFIRM_RUNS
from distci.bisect.state import BisectError
from distci.harness import procs

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
SHIM_ENV = "DISTCI_COMPILE_SHIM"
PER_STEP = ("TORCH_BISECT_BACKEND", "TORCH_BISECT_SUBSYSTEM", "TORCH_BISECT_MAX", "TORCH_COMPILE_BACKEND", SHIM_ENV)
"""What may differ between two steps' environments (`drive`, the pre-check): nothing else."""
SHIM = """\
import importlib.machinery
import os
import sys


class _TorchHook:
    \"\"\"distci compiler bisect: adjust torch.compile once torch is imported.\"\"\"

    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module, os.environ.get("DISTCI_COMPILE_SHIM", ""))

        spec.loader.exec_module = exec_module
        return spec


def _patch(torch, mode):
    original = torch.compile
    if mode == "identity":
        def compile(model=None, **kwargs):
            return model if model is not None else (lambda fn: fn)
    elif mode == "bisect" or mode.startswith("backend:"):
        from torch._dynamo.backends import registry
        from torch._inductor.compiler_bisector import CompilerBisector

        lookup = registry.lookup_backend
        fixed = mode.partition(":")[2]

        def lookup_backend(name):
            wanted = fixed or CompilerBisector.get_backend()
            return lookup(wanted if wanted and isinstance(name, str) else name)

        registry.lookup_backend = lookup_backend

        def compile(model=None, **kwargs):
            if isinstance(kwargs.get("backend", "inductor"), str):
                if fixed:
                    kwargs["backend"] = fixed
                return original(model, **kwargs)
            get = CompilerBisector.__dict__["get_backend"]
            CompilerBisector.get_backend = classmethod(lambda cls: None)
            try:
                return original(model, **kwargs)
            finally:
                CompilerBisector.get_backend = get
    else:
        return
    compile.__wrapped__ = original
    torch.compile = compile


sys.meta_path.insert(0, _TorchHook())
"""


@dataclass
class CompilerFinding:
    """What the compiler bisector found.

    `backend` None: the command passed under every backend (it fails only with the
    options the bisector does not control). `subsystem` None: the backend fails as a
    whole. `bisect_number`: which application of a repeatedly applied subsystem (the
    n-th pass run, the n-th lowering) breaks it; `debug_info` names it when torch
    records it (e.g. the pass name).
    """

    backend: str | None
    subsystem: str | None = None
    bisect_number: int | None = None
    debug_info: str | None = None
    runs: int = 0
    seconds: float = 0.0
    torch: str = ""
    log: str = ""
    status: str = "found"
    reason: str = ""
    original: str = ""
    """The command's failure as it is (the tail of its output): what every step is matched to."""
    steps: list = field(default_factory=list)
    """Every run: label, exit code, verdict (pass / fail / fails otherwise), its failure's tail."""

    def describe(self) -> str:
        if self.status != "found":
            return f"{self.status}: {self.reason}"
        if self.backend is None:
            return "no compile backend reproduces the failure"
        text = f"backend {self.backend}"
        if self.subsystem:
            text += f", subsystem {self.subsystem}"
        if self.bisect_number is not None and self.subsystem:
            text += f", application #{self.bisect_number}"
        if self.debug_info and self.debug_info != self.subsystem:
            text += f": {self.debug_info}"
        return text

    def to_dict(self) -> dict:
        return asdict(self)


def compiler_bisect(command: str, *, python: str = sys.executable, cwd: Path | str | None = None,
                    env: Mapping[str, str] | None = None, start_backend: str | None = None,
                    timeout: float | None = None, precheck: bool = True, repeats: int = 1,
                    confirm: int | bool = True, log: Callable[[str], None] = print) -> CompilerFinding:
    """Run torch's compiler bisector on `command` (a shell command: exit 0 = pass) with
    `python`, the failing environment's interpreter, whose PATH comes first; `repeats`
    and `confirm` as in every bisect mode (see `drive`).

    `env` is added to the command's environment (PYTHONPATH must make distci importable
    by `python`). `start_backend` skips the backends before it (torch's own tests do the
    same with TORCH_BISECT_BACKEND): faster, but only right when the earlier backends
    pass. Raises BisectError when the failure does not depend on torch.compile.
    """
    bindir = str(Path(python).parent)
    base = dict(os.environ, **(env or {}))
    base["PATH"] = f"{bindir}{os.pathsep}{base.get('PATH', '')}"
    base.pop("PYTHONHOME", None)
    with tempfile.TemporaryDirectory(prefix="distci-compiler-bisect-") as tmp:
        base[CACHE_ENV] = str(Path(tmp) / "inductor")
        shim = Path(tmp) / "shim"
        shim.mkdir()
        (shim / "sitecustomize.py").write_text(SHIM)
        base["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), base.get("PYTHONPATH", "")) if p)
        template = _template(command, python, base, cwd, Path(tmp), log)
        try:
            return _bisect(command, python, cwd, base, Path(tmp), template, start_backend=start_backend,
                           timeout=timeout, precheck=precheck, repeats=repeats, confirm=confirm, log=log)
        finally:
            if template is not None:
                template.stop()


def _template(command: str, python: str, env: Mapping[str, str], cwd, tmp: Path,
              log: Callable[[str], None]) -> stepfork.Template | None:
    """The step template serving `command`'s steps, or None: each step a new process."""
    if stepfork.forkable(command) is None:
        return None
    template = stepfork.Template.start(python, env, cwd, tmp, per_step=PER_STEP, shim_env=SHIM_ENV)
    why = template.ready()
    if why is None:
        log("compiler bisector: steps fork from one torch import")
        return template
    for line in textwrap.wrap(f"compiler bisector: every step a new process: {why}", 80,
                              subsequent_indent="  "):
        log(line)
    template.stop()
    return None


def _bisect(command: str, python: str, cwd, base: dict, tmp: Path, template: stepfork.Template | None, *,
            start_backend: str | None, timeout: float | None, precheck: bool, repeats: int,
            confirm: int | bool, log: Callable[[str], None]) -> CompilerFinding:
    """The run as it is, the pre-check, then the driver in the failing environment."""
    steps = str(template.socket_path) if template is not None else None
    code, original = _run_text(command, cwd, base, timeout, steps)
    if code == 0:
        raise BisectError(f"the command passes as it is (exit 0): there is no failure to bisect: {command}")
    (Path(tmp) / "original.txt").write_text(original)
    log(f"compiler bisector: as it is the command exits {code}: {_last_line(original)}")
    if precheck:
        _precheck(command, cwd, base, timeout, start_backend or "eager", log, steps)
    base[SHIM_ENV] = "bisect"
    out = Path(tmp) / "finding.json"
    argv = [python, "-m", "distci.bisect.compiler", "--out", str(out)]
    if start_backend:
        argv += ["--start-backend", start_backend]
    if timeout:
        argv += ["--timeout", str(timeout)]
    runs = CONFIRM_RUNS if confirm is True else int(confirm)
    argv += ["--repeats", str(repeats), "--confirm", str(runs), "--original", str(Path(tmp) / "original.txt")]
    if steps:
        argv += ["--steps", steps]
    log(f"compiler bisector: running {command!r} once per step")
    started = time.monotonic()
    proc = subprocess.run([*argv, "--", "sh", "-c", command], cwd=cwd, env=base,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[bisector] ")]
    for line in lines:
        log(line)
    if proc.returncode != 0 or not out.exists():
        said = "\n".join(line[len("[bisector] "):] for line in lines[-1:])
        raise BisectError(said or f"the compiler bisector failed (exit {proc.returncode}):\n"
                          + "\n".join(proc.stdout.strip().splitlines()[-15:]))
    data = json.loads(out.read_text())
    data["seconds"] = round(time.monotonic() - started, 1)
    data["log"] = "\n".join(line[len("[bisector] "):] for line in lines)
    return CompilerFinding(**data)


def _precheck(command: str, cwd, env: Mapping[str, str], timeout: float | None, first: str,
              log: Callable[[str], None], steps: str | None = None) -> None:
    """Is the failure the compiler's? (That it fails as it is, the bisector's first step
    shows: a command that passes everywhere ends with no backend.)"""
    eager = _run(command, cwd, dict(env, **{SHIM_ENV: "identity"}), timeout, steps)
    log(f"compiler bisector: with torch.compile as an identity the command exits {eager}")
    if eager == 0:
        return
    simplest = _run(command, cwd, dict(env, **{SHIM_ENV: f"backend:{first}"}), timeout, steps)
    log(f"compiler bisector: with every compile on the {first} backend the command exits {simplest}")
    if simplest != 0:
        raise BisectError(f"the command fails with torch.compile replaced by an identity (exit "
                          f"{eager}) and with the {first} backend (exit {simplest}): the failure is "
                          "not the compiler's; bisect versions instead")


def _run(command: str | Sequence[str], cwd, env: Mapping[str, str], timeout: float | None,
         steps: str | None = None) -> int:
    return _run_text(command, cwd, env, timeout, steps)[0]


TAIL = 4000
"""Characters of a step's output kept: enough for the traceback's end."""


def _run_text(command: str | Sequence[str], cwd, env: Mapping[str, str], timeout: float | None,
              steps: str | None = None) -> tuple[int, str]:
    """(exit code, `exit N` and the tail of its output); 124 for a timeout. The output goes
    to a file, not a pipe: a chatty command cannot block on a full pipe. With `steps` (a
    step template's socket) a `python SCRIPT` command runs as its fork when it accepts."""
    argv = stepfork.forkable(command) if steps else None
    with tempfile.NamedTemporaryFile() as out:
        code = stepfork.run(steps, argv, cwd, env, timeout, out.name) if steps and argv else None
        if code is None:
            code = _run_new(command, cwd, env, timeout, out)
        out.seek(max(0, out.seek(0, os.SEEK_END) - TAIL))
        text = out.read().decode(errors="replace")
    return code, f"exit {code}\n{text}"


def _run_new(command: str | Sequence[str], cwd, env: Mapping[str, str], timeout: float | None, out) -> int:
    proc = subprocess.Popen(command, shell=isinstance(command, str), cwd=cwd, env=dict(env), stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124
    finally:
        procs.kill_group(proc)
        proc.wait()


def _last_line(text: str) -> str:
    return " / ".join(failure_signature(text)[1:]) or "(no output)"


# -- the driver, inside the failing environment ------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m distci.bisect.compiler --out F.json -- CMD...`: bisect CMD's compile."""
    parser = argparse.ArgumentParser(prog="python -m distci.bisect.compiler")
    parser.add_argument("--out", required=True)
    parser.add_argument("--start-backend")
    parser.add_argument("--timeout", type=float)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--confirm", type=int, default=CONFIRM_RUNS, help="fresh runs per confirmed configuration")
    parser.add_argument("--original", help="a file holding the original failure's text")
    parser.add_argument("--steps", help="a step template's socket: search steps fork from it")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")

    import torch

    try:
        from torch._inductor import compiler_bisector as cb
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:
        print(f"[bisector] torch {torch.__version__} has no compiler bisector (torch >= 2.6 has)",
              flush=True)
        return 3

    if args.start_backend:
        names = list(cb.BACKENDS)
        if args.start_backend not in names:
            parser.error(f"--start-backend must be one of {names}")
        for name in names[:names.index(args.start_backend)]:
            del cb.BACKENDS[name]
    if hasattr(cb.CompilerBisector, "in_process_cache"):  # torch >= 2.9: share the state dir with children
        cb.CompilerBisector.in_process_cache = cache_dir()
    original = Path(args.original).read_text() if args.original else None
    finding = drive(cb, lambda env: _run_text(list(command), None, env, args.timeout, args.steps),
                    dict(os.environ), repeats=args.repeats, confirm=args.confirm, original=original,
                    fresh_run=lambda env: _run_text(list(command), None, env, args.timeout),
                    log=lambda line: print(f"[bisector] {line}", flush=True))
    finding.torch = torch.__version__
    Path(args.out).write_text(json.dumps(finding.to_dict()))
    print(f"[bisector] {finding.describe()}", flush=True)
    return 0


class _Flaky(Exception):
    pass


Step = Union[int, "tuple[int, str]"]


def drive(cb: Any, run: Callable[[dict], Step], environ: Mapping[str, str], *, repeats: int = 1,
          confirm: int | bool = True, original: str | None = None,
          log: Callable[[str], None] = print, fresh_run: Callable[[dict], Step] | None = None) -> CompilerFinding:
    """torch's `cb.CompilerBisector.do_bisect` over `run(env) -> exit code` (or (exit code,
    output)), under the honesty contract of every bisect mode: each step runs `repeats`
    times and runs that disagree end it as `flaky`; with `confirm` (fresh runs, True: the
    engine's CONFIRM_RUNS) the finding's pair gets that many runs beyond the search's
    (the backend before it passes, it fails; a subsystem found: that backend with the
    subsystem disabled passes), and a contradiction makes it `unconfirmed`. With
    `original` (the command's failure as it is), a step fails only when its failure has
    the same signature; each step's text is kept in the finding's `steps`. `fresh_run`
    (default `run`) makes the confirmation's fresh runs: new processes where `run` forks."""
    bisector = cb.CompilerBisector
    fresh = CONFIRM_RUNS if confirm is True else int(confirm)
    runs = 0
    started = time.monotonic()
    steps: list[dict] = []
    want = failure_signature(original) if original else None

    seen: dict[tuple, list[bool]] = {}  # fixed configurations -> every run's pass/fail

    def steady(env: dict, label: str, times: int, key: tuple | None = None, runner: Callable = run) -> bool:
        """Run until `times` runs of this configuration agree (runs the search already
        made of a fixed configuration count); raise _Flaky when they do not."""
        nonlocal runs
        passed = seen.setdefault(key, []) if key is not None else []
        while len(passed) < times:
            runs += 1
            began = time.monotonic()
            answer = runner(env)
            code, text = answer if isinstance(answer, tuple) else (answer, "")
            other = code != 0 and want is not None and failure_signature(text) != want
            verdict = "pass" if code == 0 else "fails otherwise" if other else "fail"
            passed.append(code == 0 or other)  # another failure is not this one: not where it breaks
            steps.append({"run": runs, "label": label, "exit": code, "verdict": verdict,
                          "tail": text[-1500:] if code else ""})
            log(f"run {runs}: {label} -> {'pass' if code == 0 else f'{verdict} (exit {code})'}"
                + (f" [{_last_line(text)}; the original: {_last_line(original or '')}]" if other else "")
                + f" ({time.monotonic() - began:.1f}s)")
            if len(set(passed)) > 1:
                raise _Flaky(f"{label} is flaky: {len(passed)} runs answered "
                             f"{', '.join('pass' if p else 'fail' for p in passed)}; nothing can be named")
        return passed[0]

    def env_of(backend: str | None, subsystem: str | None, disabled: bool) -> dict:
        env = dict(environ)
        if backend:
            env["TORCH_COMPILE_BACKEND"] = backend
            env["TORCH_BISECT_BACKEND"] = backend
        if subsystem:
            env["TORCH_BISECT_SUBSYSTEM"] = subsystem
            if disabled:
                env["TORCH_BISECT_MAX"] = "-1"
        return env

    def check() -> bool:
        backend, subsystem = bisector.get_backend(), bisector.get_subsystem()
        disabled = bool(subsystem) and bisector.get_run_state(backend, subsystem) == "test_disable"
        fixed = (backend, subsystem, disabled) if not subsystem or disabled else None  # not a bisect step
        return steady(env_of(backend, subsystem, disabled), f"backend={backend} subsystem={subsystem or '-'}",
                      repeats, fixed)

    order = list(cb.BACKENDS)
    bisector.bisection_enabled = True
    try:
        result = bisector.do_bisect(check)
        finding = CompilerFinding(
            backend=getattr(result, "backend", None), subsystem=getattr(result, "subsystem", None),
            bisect_number=getattr(result, "bisect_number", None),
            debug_info=getattr(result, "debug_info", None))
        if fresh and finding.backend:
            times = repeats + fresh
            at = order.index(finding.backend) if finding.backend in order else 0
            pairs = [(finding.backend, None, False, False)]
            if at > 0:
                pairs.append((order[at - 1], None, False, True))
            if finding.subsystem and not isinstance(_subsystem(cb, finding), getattr(cb, "BinarySubsystem", ())):
                pairs.append((finding.backend, finding.subsystem, True, True))
            for backend, subsystem, disabled, should_pass in pairs:
                label = f"confirm: backend={backend} subsystem={subsystem or '-'}" + (" disabled" if disabled else "")
                if steady(env_of(backend, subsystem, disabled), label, times,
                          (backend, subsystem, disabled), fresh_run or run) != should_pass:
                    finding.status = "unconfirmed"
                    finding.reason = (f"{label} {'fails' if should_pass else 'passes'} when run again: "
                                      "the finding does not hold; the command is not steady")
                    break
    except _Flaky as flaky:
        finding = CompilerFinding(backend=None, status="flaky", reason=str(flaky))
    except RuntimeError as exc:  # torch's bisector saw answers that contradict each other
        finding = CompilerFinding(backend=None, status="flaky",
                                  reason=f"torch's bisector found the command inconsistent: {exc}")
    finding.runs, finding.seconds = runs, round(time.monotonic() - started, 1)
    finding.steps, finding.original = steps, (original or "")[-1500:]
    return finding


def _subsystem(cb: Any, finding: CompilerFinding) -> Any:
    return next((s for s in cb.BACKENDS.get(finding.backend, []) if s.name == finding.subsystem), None)


if __name__ == "__main__":
    sys.exit(main())
