"""Run the declared external suites for one cell and write their Results to its run directory.

Each upstream test becomes a Result like a native one: its own test id, outcome,
failure kind, the Stack captured in the cell environment (with the upstream origin,
ref and commit the tests came from), a normalized error signature, the known issue it
matches, and a one-line repro. A case the cell cannot run (too few GPUs, another
accelerator, a missing module) is a `skipped` Result that says why; a suite whose
sources cannot be had is one `infra` Result, never a regression.
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from distci.errors import ConfigError, InfraError, SourceError
from distci.harness.outcome import Combined
from distci.results import Result, error_signature
from distci.rundir import RecordError, RunDir, repro_line
from distci.stack import Stack

from distci.external.adapters import adapter
from distci.external.fetch import Checkout, UpstreamRef, default_root, ensure_checkout, explicit_directory, upstream_ref
from distci.external.fixenv import ensure_fix_site, fixes_env
from distci.external.launch import CaseContext, LaunchEnv
from distci.external.spec import Case, SuiteSpec
from distci.results import format_duration

Log = Callable[[str], None]


class Interrupted(BaseException):
    """The controller was told to stop (SIGTERM/SIGHUP from a job or CI timeout, Ctrl-C).

    A BaseException, so it unwinds through the launch code, which kills the test's
    process session on the way; the runner then records the test it was in and stops.
    """


@contextlib.contextmanager
def _interruptible():
    """Turns SIGTERM and SIGHUP into Interrupted (only the main thread can take signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class ExternalRun:
    """One run of external suites in one cell environment."""

    run_dir: Path
    run_id: str
    cell_id: str
    device_type: str
    python: str
    fixes: str = "on"
    fix_packages: Sequence[Path] = ()
    slots: int | None = None
    sources: Mapping[str, Path] = field(default_factory=dict)
    refs: Mapping[str, str] = field(default_factory=dict)
    select: Sequence[str] = ()
    keyword: str | None = None
    known_issues: Path | None = None
    cache_root: Path | None = None
    unset_env: Sequence[str] = ()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def repro(cell_id: str, test_id: str) -> str:
    if cell_id and cell_id != "local":
        return repro_line(cell_id, test_id)
    return f"python -m distci.external run --test {shlex.quote(test_id)}"


def _safe(test_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", test_id.removeprefix("external/"))[:150]


def _relative(path: Path | None, root: Path) -> str:
    """Log paths relative to the run directory: run directories move (CI artifacts, reports/gpu)."""
    if path is None:
        return ""
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def probe(where: LaunchEnv, packages: Sequence[str], modules: Sequence[str]) -> dict[str, Any]:
    """The Stack and the upstream packages, captured by the cell's python with the launch env."""
    cmd = [where.python, "-m", "distci.external.entry", "probe", "--packages", ",".join(packages),
           "--modules", ",".join(modules)]
    proc = subprocess.run(cmd, cwd=where.cwd, env=where.environ(), capture_output=True, text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise InfraError("capturing the stack in the cell environment failed", log=(proc.stdout + proc.stderr)[-4000:])
    return json.loads(lines[-1])


def slots_of(stack: Stack, device_type: str, default: int) -> int:
    """How many ranks the cell can place: its devices on an accelerator, its world size on cpu."""
    if device_type == "cpu":
        return default
    return int(stack.device_count or 0)


def _sm(stack: Stack) -> int | None:
    cap = stack.device_capability
    if not cap:
        return None
    major, _, minor = str(cap).partition(".")
    return int(major) * 10 + int(minor or 0)


def skip_reason(case: Case, device_type: str, slots: int, stack: Stack, missing: set[str]) -> str:
    if case.skip:
        return case.skip
    req = case.requires
    if req.accelerator and req.accelerator != device_type:
        return f"needs {req.accelerator}; the cell is {device_type}"
    if req.nproc > slots:
        unit = "GPUs" if device_type == "cuda" else ("devices" if device_type != "cpu" else "processes")
        return f"needs {req.nproc} {unit}; the cell has {slots}"
    sm = _sm(stack)
    if req.sm and device_type == "cuda" and (sm is None or sm < req.sm):
        return f"needs sm_{req.sm}; the device is {'sm_' + str(sm) if sm else 'unknown'}"
    lacking = [m for m in req.modules if m in missing]
    if lacking:
        return f"needs {', '.join(lacking)}, not importable in the cell environment"
    return ""


def selected(test_id: str, patterns: Sequence[str], keyword: str | None) -> bool:
    if keyword and keyword not in test_id:
        return False
    if not patterns:
        return True
    return any(fnmatch.fnmatchcase(test_id, p) or p.startswith(test_id + "::") or test_id.startswith(p + "::")
               for p in patterns)


class Recorder:
    """Turns outcomes into Results and appends them to the run's results.jsonl."""

    def __init__(self, run: ExternalRun, stack: Stack) -> None:
        self.run = run
        self.stack = stack
        self.writer = RunDir(run.run_dir)
        self.results: list[Result] = []
        self.registry = None
        if run.known_issues and Path(run.known_issues).exists():
            from distci.known_issues import load_registry

            self.registry = load_registry(Path(run.known_issues))

    def record(self, test_id: str, combined: Combined, *, started: str, log_path: Path | None,
               stack: Stack | None = None) -> Result:
        stack = stack or self.stack
        result = combined.to_result(run_id=self.run.run_id, cell_id=self.run.cell_id, test_id=test_id, stack=stack,
                                    repro=repro(self.run.cell_id, test_id), started_at=started,
                                    log_path=_relative(log_path, self.run.run_dir), registry=self.registry)
        try:
            self.writer.append(result)
        except RecordError as exc:  # a full disk: the suites stop, the run ends as infra (cellrun)
            raise InfraError(str(exc)) from exc
        self.results.append(result)
        return result

    def infra(self, test_id: str, exc: Exception, stack: Stack | None = None) -> Result:
        log = getattr(exc, "log", "") or ""
        combined = Combined("error", "infra", type(exc).__name__, f"{exc}\n{log}".strip(),
                            error_signature(type(exc).__name__, str(exc)))
        return self.record(test_id, combined, started=_now(), log_path=None, stack=stack)


def run_external(suites: Sequence[SuiteSpec], run: ExternalRun, *, world_size: int = 2,
                 log: Log = print) -> list[Result]:
    """Run every selected case of `suites`; returns the Results written to the run directory."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    cache = Path(run.cache_root) if run.cache_root else default_root()
    ext_dir = run.run_dir / "external"
    base = LaunchEnv(python=run.python, cwd=run.run_dir, device_type=run.device_type, log_dir=ext_dir / "logs",
                     env={"DISTCI_FIXES": fixes_env(run.fixes), "DISTCI_CELL": run.cell_id},
                     unset=tuple(run.unset_env))
    base.log_dir.mkdir(parents=True, exist_ok=True)
    try:
        base.fix_site = ensure_fix_site([Path(p) for p in run.fix_packages], cache, log=log)
        packages = sorted({s.package for s in suites})
        modules = sorted({m for s in suites for m in s.requires_modules + tuple(
            x for c in s.cases for x in c.requires_modules)})
        found = probe(base, packages, modules)
    except (InfraError, ConfigError) as exc:
        recorder = Recorder(run, Stack.from_dict({"partial": True, "error": str(exc)}))
        for suite in suites:
            recorder.infra(f"external/{suite.name}", exc)
        _finish(run)
        return recorder.results
    stack = Stack.from_dict(found["stack"])
    stack.extra["external_fix_packages"] = [Path(p).name for p in run.fix_packages]
    RunDir(run.run_dir).write_stack(stack, keep=True)
    slots = run.slots if run.slots is not None else slots_of(stack, run.device_type, world_size)
    missing = set(found.get("missing_modules", []))
    recorder = Recorder(run, stack)
    log(f"external: stack torch {stack.torch} on {run.device_type} x{slots}; fixes {fixes_env(run.fixes)}")
    try:
        with _interruptible():
            for suite in suites:
                _run_suite(suite, run, base, found["packages"].get(suite.package), stack, slots, missing, recorder,
                           cache, log)
    finally:
        _finish(run)
    return recorder.results


def _finish(run: ExternalRun) -> None:
    rundir = RunDir(run.run_dir)
    if rundir.results_path.exists():
        try:
            rundir.write_junit(run.cell_id)
        except OSError as exc:  # written beside and renamed: the old junit.xml stays whole
            print(f"external: cannot write {rundir.junit_path}: {exc}", file=sys.stderr, flush=True)


def _run_suite(suite: SuiteSpec, run: ExternalRun, base: LaunchEnv, installed: Mapping[str, Any] | None,
               stack: Stack, slots: int, missing: set[str], recorder: Recorder, cache: Path,
               log: Log) -> None:
    suite_id = f"external/{suite.name}"
    directory = run.sources.get(suite.name) or explicit_directory(suite)
    if not (installed or {}).get("version") and directory is None:
        if not run.select or any(p.startswith(suite_id) for p in run.select):
            recorder.record(suite_id, Combined("skipped", message=f"{suite.package} is not installed in this cell"),
                            started=_now(), log_path=None)
        return
    try:
        if directory is not None and suite.name not in run.refs:
            ref = UpstreamRef(suite.package, (installed or {}).get("version"), "directory")
        else:
            ref = upstream_ref(suite, installed, override=run.refs.get(suite.name))
        checkout: Checkout = ensure_checkout(suite, ref, root=cache, directory=directory, log=log)
        where = replace(base, cwd=checkout.path, env={**base.env, **suite.env})
        provenance = {"origin": checkout.origin, "ref": checkout.ref, "commit": checkout.commit}
        if checkout.substituted:
            provenance["substituted"] = dict(checkout.substituted)
        suite_stack = replace(stack, extra={**stack.extra, "external": {suite.name: provenance}})
        cases = adapter(suite.adapter).expand(suite, checkout, where)
    except (InfraError, SourceError, ConfigError, OSError) as exc:
        log(f"external {suite.name}: infra: {exc}")
        recorder.infra(suite_id, exc)
        return
    log(f"external {suite.name}: {len(cases)} cases from {checkout.origin} at {checkout.ref}")
    mod = adapter(suite.adapter)
    narrow = getattr(mod, "narrow", None)
    for case in cases:
        if not selected(case.test_id, run.select, run.keyword):
            continue
        narrowed = [n for p in run.select if narrow and (n := narrow(case, p))]
        case = narrowed[0] if narrowed else case
        started = _now()
        reason = skip_reason(case, run.device_type, slots, stack, missing)
        if reason:
            recorder.record(case.test_id, Combined("skipped", message=reason), started=started, log_path=None,
                            stack=suite_stack)
            log(f"  SKIP {case.test_id}: {reason}")
            continue
        log_path = base.log_dir / f"{_safe(case.test_id)}.log"
        ctx = CaseContext(where=where, log_path=log_path, out_dir=run.run_dir / "external" / "out" / _safe(case.test_id))
        start = time.monotonic()
        try:
            outcomes = mod.run(case, ctx)
        except (InfraError, OSError) as exc:
            recorder.infra(case.test_id, exc, stack=suite_stack)
            continue
        except (Interrupted, KeyboardInterrupt) as exc:
            why = str(exc) or "SIGINT"
            message = (f"the run was stopped ({why}) {time.monotonic() - start:.0f}s into this test, before it "
                       f"finished; its log so far: {log_path}")
            recorder.record(case.test_id, Combined("error", "infra", "Interrupted", message,
                                                   error_signature("Interrupted", f"stopped by {why}")),
                            started=started, log_path=log_path, stack=suite_stack)
            log(f"  STOPPED {case.test_id}: {why}")
            raise
        for test_id, combined in outcomes:
            result = recorder.record(test_id, combined, started=started, log_path=log_path, stack=suite_stack)
            tail = f" [{result.failure_kind}] {result.error_signature}" if result.failure_kind else ""
            log(f"  {result.outcome.upper():7s} {test_id} ({format_duration(result.duration_s)}){tail}")
