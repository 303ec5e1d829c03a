"""Fix audit: for every torch version and every fix, is the bug there and does the fix work?

For each version the audit reuses (or creates once) the stack env (distci.provision.envs: the
same env a cell or a bisect probe of that stack gets) with that torch and the
distci-fixes wheel, asks the fix package in that venv what it sees (detect() with
fixes off, the range decision, the status with fixes on), and runs each fix's
regression test twice through the harness: with `DISTCI_FIXES=none` and with
`DISTCI_FIXES=<that fix only>`. The verdict per fix and version:

    needed             off fails, on passes: the fix earns its keep here
    obsolete since X   off passes here and on every later version from X on
    not affected       off passes here, but a later version needs the fix
    absent in every audited version   off passes on every version audited
    broken             on fails (the fix does not fix, or breaks what worked)
    n/a                the test skipped itself on this stack
    infra              the environment or the run never came up

X is the first audited version where the bug is absent after one where it was present,
so it depends on the versions audited, never on which of them is the oldest.

A fix whose target is a third-party package (torchtitan) is audited once per version of
that package (`--package torchtitan==0.2.2 --package torchtitan==0.3.0`): the package is
installed in a stack env of its own (torch + that package), for every torch version in
the fix's range, and the rows are judged per package version.

Envs come from a wheelhouse downloaded once per stack (pip, which honours the machine's
pip configuration: a constraints file capping torch needs PIP_CONSTRAINT pointed
elsewhere for newer torch) and are installed with uv when it is on PATH.

Results go to .distci/audit/<stamp>/ (audit.json, audit.md) and the terminal (rich).
`--report PATH` also writes the markdown table there (reports/fix-audit.md in the repo).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from distci.errors import ConfigError, DistciError, InfraError
from distci.run.cellrun import QUIET_PLUGINS
from distci.audit.model import Audit, AuditRow, NOT_APPLIED, TestRun, first_line, junit_counts, target_package, judge

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VERSIONS = ("2.5.1", "2.6.0", "2.7.0", "2.8.0", "2.10.0", "2.13.0", "2.14.1", "2.15.0")
DEFAULT_PACKAGES = ("torchtitan==0.2.2", "torchtitan==0.3.0")
"""The third-party package versions a fix for that package is audited against."""
PACKAGE_COMPANIONS = ("triton",)
"""Installed with a third-party package: torchtitan 0.3 imports triton, which CPU torch builds lack
(a CUDA build pins its own, and the resolver keeps that pin)."""
VENV_PACKAGES = ("pytest", "packaging", "numpy")
TORCH_INDEX_ENV = "DISTCI_TORCH_INDEX_URL"
"""Optional extra index for torch wheels (configuration, never committed)."""

PROBE = r"""
import json, sys
import torch, distci_fixes
from distci_fixes import TorchBuild, decide
build = TorchBuild.current()
mode = sys.argv[1]
only = [i for i in sys.argv[2].split(",") if i] or None
out = {"torch": torch.__version__, "git_version": getattr(torch.version, "git_version", ""),
       "targets": {f.id: f.target for f in distci_fixes.all_fixes()},
       "autoload_hook": hasattr(torch, "_import_device_backends"),
       "fixes_module": "distci_fixes" in sys.modules}
if mode == "off":
    out["present"] = distci_fixes.detect_all(only)
    out["range"] = {f.id: decide(f.applies, build).in_range for f in distci_fixes.all_fixes()}
    out["tests"] = {f.id: f.test for f in distci_fixes.all_fixes()}
else:
    out["report"] = distci_fixes.report(settle=True)
print("DISTCI_PROBE " + json.dumps(out))
"""


# --- environments ---------------------------------------------------------------------


def venv_name(version: str, packages: Sequence[str] = ()) -> str:
    """torch 2.13.0 alone: `2.13.0`; with torchtitan 0.3.0: `2.13.0+torchtitan-0.3.0`."""
    return "+".join([version, *(p.replace("==", "-") for p in packages)])


def _run(cmd: Sequence[str], *, env: Optional[dict] = None, timeout: float = 3600, cwd: Path = REPO
         ) -> subprocess.CompletedProcess:
    return subprocess.run(list(map(str, cmd)), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _installed(python: Path, dist: str = "torch") -> Optional[str]:
    if not python.exists():
        return None
    proc = _run([python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"], timeout=120)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _installed_torch(python: Path) -> Optional[str]:
    return _installed(python, "torch")


def _pinned(requirement: str) -> tuple[str, str]:
    name, sep, version = requirement.partition("==")
    if not sep or not name.strip() or not version.strip():
        raise ConfigError(f"--package {requirement!r}: expected NAME==VERSION")
    return name.strip(), version.strip()


def ensure_venv(root: Path, version: str, log=print, packages: Sequence[str] = ()) -> Path:
    """The interpreter of the env for torch `version` (plus `packages`, NAME==VERSION lines).

    It is distci.provision.envs' env of that stack (one venv primitive: a cell or a bisect probe of
    the same requirements gets the same env), built under `root` from a wheelhouse
    downloaded once (the default index serves CUDA builds for old versions; they run on
    CPU), with the distci-fixes wheel of this checkout installed last (an edit of fixes/
    reinstalls only that wheel).
    """
    from distci.provision.envs import stack_env
    from distci.provision.selfwheels import build_wheel

    name = venv_name(version, packages)
    extra = ["--extra-index-url", os.environ[TORCH_INDEX_ENV]] if os.environ.get(TORCH_INDEX_ENV) else []
    companions = list(PACKAGE_COMPANIONS) if packages else []
    fixes = build_wheel("distci_fixes", Path(".distci") / "selfwheels", log=log)
    log(f"[{name}] env: torch=={version}{''.join(', ' + p for p in packages)}")
    try:
        env = stack_env([f"torch=={version}", *packages, *companions, *VENV_PACKAGES], extra,
                        extra_wheels=[fixes], env_root=root, log=lambda line: log(f"[{name}] {line}"))
    except InfraError:
        raise
    except DistciError as exc:  # a resolution the index cannot satisfy: this version's row is infra
        raise InfraError(f"env for torch {version} failed: {exc}") from None
    return env.python


# --- probing and running --------------------------------------------------------------


def _env(fixes: str, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DISTCI_FIXES"}
    env.update(extra)
    env["DISTCI_FIXES"] = fixes
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def probe(python: Path, fixes: str, extra_env: dict[str, str], only: Optional[set[str]] = None) -> dict[str, Any]:
    """What distci_fixes sees in `python` under DISTCI_FIXES=fixes (detect() only for `only`)."""
    mode = "off" if fixes == "none" else "on"
    proc = _run([python, "-c", PROBE, mode, ",".join(sorted(only or ()))], env=_env(fixes, extra_env), timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("DISTCI_PROBE "):
            return json.loads(line[len("DISTCI_PROBE "):])
    raise InfraError(f"probe with DISTCI_FIXES={fixes} printed nothing", log=(proc.stdout + proc.stderr)[-4000:])


def run_tests(python: Path, tests: Sequence[str], fixes: str, out: Path, extra_env: dict[str, str],
              timeout: float) -> dict[str, TestRun]:
    """One pytest run of `tests` through the harness with DISTCI_FIXES=fixes: a TestRun per file.

    One run for several files starts the rank pool once, which is most of a small test's cost.
    """
    out.mkdir(parents=True, exist_ok=True)
    junit = out / f"junit-{fixes.replace(',', '+')}.xml"
    log = out / f"pytest-{fixes.replace(',', '+')}.log"
    started = time.monotonic()
    cmd = [python, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-q", "-rfEs",
           *tests, f"--junitxml={junit}"]
    budget = timeout * max(1, len(tests))
    try:
        proc = _run(cmd, env=_env(fixes, extra_env), timeout=budget)
        text = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        log.write_text(f"timeout after {budget:.0f}s\n{exc.stdout or ''}")
        return {t: TestRun("infra", message=f"timeout after {budget:.0f}s", seconds=time.monotonic() - started)
                for t in tests}
    log.write_text(text)
    seconds = time.monotonic() - started
    if not junit.exists():
        last = text.strip().splitlines()[-1] if text.strip() else "no output"
        return {t: TestRun("infra", message=last, seconds=seconds) for t in tests}
    runs = {}
    for test in tests:
        passed, failed, skipped, message = junit_counts(junit, test)
        if failed:
            outcome = "failed"
        elif passed:
            outcome = "passed"
        elif skipped:
            outcome = "skipped"
        else:
            outcome = "infra"
            message = message or "no test ran"
        runs[test] = TestRun(outcome, passed, failed, skipped, first_line(message), seconds)
    return runs


def run_test(python: Path, test: str, fixes: str, out: Path, extra_env: dict[str, str],
             timeout: float) -> TestRun:
    """One pytest run of `test` through the harness with DISTCI_FIXES=fixes."""
    return run_tests(python, [test], fixes, out, extra_env, timeout)[test]


# --- verdicts -------------------------------------------------------------------------


# --- the audit ------------------------------------------------------------------------


def _audit_fixes(python: Path, version: str, fixes: Sequence[tuple[str, str]], out: Path,
                 extra_env: dict[str, str], timeout: float, log, off: dict, on: dict,
                 package: str = "") -> list[AuditRow]:
    """Rows for `fixes` (id, test) in one venv: every test with fixes off in one pytest run,
    then each test with only its fix on, where that fix is applied (where it is not, the
    process is the off one, and the off run stands for it: `same_as_off`)."""
    if not fixes:
        return []
    where = venv_name(version, [package] if package else [])
    tests = sorted({test for _, test in fixes})
    log(f"[{where}] fixes off: {', '.join(tests)}")
    offs = run_tests(python, tests, "none", out, extra_env, timeout)
    statuses = {r["id"]: r.get("status", "?") for r in on["report"]}
    rows = []
    for fix_id, test in fixes:
        status = statuses.get(fix_id, "?")
        run_off = offs[test]
        if status in NOT_APPLIED:
            run_on = replace(run_off, same_as_off=True)
        else:
            log(f"[{where}] {fix_id} on: {test}")
            run_on = run_test(python, test, fix_id, out / fix_id, extra_env, timeout)
        rows.append(AuditRow(fix=fix_id, torch=version, test=test, present=off["present"].get(fix_id),
                             in_range=off["range"].get(fix_id), status=status, off=run_off, on=run_on,
                             package=package))
    return rows


def audit_version(version: str, root: Optional[Path], out: Path, only: Optional[set[str]],
                  extra_env: dict[str, str], timeout: float, log=print, python: Optional[Path] = None,
                  packages: Sequence[str] = ()) -> tuple[list[AuditRow], Optional[bool]]:
    """Audit one torch: the managed venv root/<version>, or `python` as it is.

    A fix whose target package is one of `packages`' names is audited once per such
    package version instead, in root/<version>+<package>-<v> (managed venvs only),
    for torch versions in its range.
    """
    vout = out / version
    vout.mkdir(parents=True, exist_ok=True)
    try:
        if python is None:
            assert root is not None
            python = ensure_venv(root, version, log)
        off = probe(python, "none", extra_env, only)
        on = probe(python, ",".join(sorted(only)) if only else "all", extra_env)
    except InfraError as exc:
        log(f"[{version}] infra: {exc}")
        (vout / "infra.log").write_text(exc.log)
        return [], None
    by_name: dict[str, list[str]] = {}
    for requirement in packages if root is not None else ():
        by_name.setdefault(_pinned(requirement)[0], []).append(requirement)
    chosen = [(fix_id, test) for fix_id, test in off["tests"].items() if not only or fix_id in only]
    own = [(f, t) for f, t in chosen if not by_name.get(target_package(off.get("targets", {}).get(f, "")))]
    rows = _audit_fixes(python, version, own, vout, extra_env, timeout, log, off, on)
    for fix_id, test in chosen:
        for requirement in by_name.get(target_package(off.get("targets", {}).get(fix_id, "")), []):
            fout = vout / f"{fix_id}+{requirement.replace('==', '-')}"
            if off["range"].get(fix_id) is False:
                not_run = TestRun("skipped", message=f"torch {version} is outside the fix's range: not run")
                rows.append(AuditRow(fix=fix_id, torch=version, test=test, present=None, in_range=False,
                                     status="out_of_range", off=not_run, on=not_run, package=requirement))
                continue
            try:
                assert root is not None
                with_package = ensure_venv(root, version, log, packages=[requirement])
                package_off = probe(with_package, "none", extra_env, {fix_id})
                package_on = probe(with_package, fix_id, extra_env)
                rows += _audit_fixes(with_package, version, [(fix_id, test)], fout, extra_env, timeout, log,
                                     package_off, package_on, package=requirement)
            except InfraError as exc:
                log(f"[{version} {requirement}] infra: {exc}")
                fout.mkdir(parents=True, exist_ok=True)
                (fout / "infra.log").write_text(exc.log)
                infra = TestRun("infra", message=str(exc))
                rows.append(AuditRow(fix=fix_id, torch=version, test=test, present=None, in_range=None,
                                     status="?", off=infra, on=infra, package=requirement))
    return rows, bool(on.get("autoload_hook")) and bool(on.get("fixes_module"))


def run_audit(versions: Sequence[str], root: Optional[Path], out_root: Path, only: Optional[set[str]] = None,
              extra_env: Optional[dict[str, str]] = None, timeout: float = 1800, log=print,
              python: Optional[Path] = None, packages: Sequence[str] = ()) -> Audit:
    """Audit `versions` in managed venvs under root, or (python given) that interpreter.

    `packages` (NAME==VERSION) are the third-party versions fixes for those packages are
    audited against (managed venvs only: a given interpreter is audited as it is).
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = out_root / stamp
    out.mkdir(parents=True, exist_ok=True)
    if python is not None:
        versions = [_installed_torch(python) or "unknown"]
    audit = Audit(versions=list(versions), started=stamp, env=dict(extra_env or {}),
                  packages=list(packages) if python is None else [])
    started = time.monotonic()
    for version in versions:
        rows, autoload = audit_version(version, root, out, only, extra_env or {}, timeout, log, python,
                                       packages=audit.packages)
        audit.rows += rows
        if autoload is not None:
            audit.autoload[version] = autoload
        # after every version, so a crash or a deadline loses nothing already run
        judge(audit.rows)
        audit.seconds = time.monotonic() - started
        (out / "audit.json").write_text(json.dumps(asdict(audit), indent=2) + "\n")
    judge(audit.rows)
    audit.seconds = time.monotonic() - started
    (out / "audit.json").write_text(json.dumps(asdict(audit), indent=2) + "\n")
    from distci.audit.report import to_markdown

    (out / "audit.md").write_text(to_markdown(audit))
    latest = out_root / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(out.name)
    log(f"audit written to {out}")
    return audit


# --- command line ---------------------------------------------------------------------


def _versions(text: str) -> list[str]:
    from packaging.version import InvalidVersion, Version

    versions = [v.strip() for v in text.split(",") if v.strip()]
    for v in versions:
        try:
            Version(v)
        except InvalidVersion:
            raise ConfigError(f"--torch: {v!r} is not a version") from None
    return versions


def _extra_env(pairs: Optional[list[str]]) -> dict[str, str]:
    env = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


def _cmd(args: argparse.Namespace) -> int:
    from distci.audit.report import merge, print_table, reload, to_markdown

    if args.render:
        audit = merge([reload(Path(d)) for d in args.render])
        print_table(audit)
        if args.report:
            Path(args.report).write_text(to_markdown(audit))
        _bisect(args, audit)
        return 0
    packages = [p for p in (args.package or DEFAULT_PACKAGES) if p != "none"]
    for requirement in packages:
        _pinned(requirement)
    audit = run_audit(_versions(args.torch), Path(args.cache), Path(args.out),
                      set(args.fix) if args.fix else None, _extra_env(args.env), args.timeout,
                      python=Path(args.python) if args.python else None, packages=packages)
    print_table(audit)
    if args.report:
        Path(args.report).write_text(to_markdown(audit))
    _bisect(args, audit)
    return 1 if any(r.verdict in ("broken", "infra") for r in audit.rows) else 0


def _bisect(args: argparse.Namespace, audit: Audit) -> None:
    """--bisect: which upstream change made each obsolete fix obsolete (distci.bisect.fix_audit)."""
    if not args.bisect:
        return
    from distci.bisect.fix_audit import bisect_audit
    from distci.bisect.fix_audit import to_markdown as bisect_table

    def package_env(change) -> Path:  # the audit's env of that torch with the newer package version
        python = ensure_venv(Path(args.cache), change.torch, packages=[f"{change.axis}=={change.first_absent}"])
        return python.parent.parent

    table = bisect_table(bisect_audit(audit.rows, out=Path(args.out), package_env=package_env))
    print(table)
    if args.report:
        with Path(args.report).open("a") as fh:
            fh.write("\n" + table)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers `fixes-audit` on an argparse subparsers object."""
    p = subparsers.add_parser("fixes-audit", help="run every fix's regression test off and on per torch version",
                              description=__doc__.splitlines()[0])
    p.add_argument("--torch", default=",".join(DEFAULT_VERSIONS), help="comma-separated torch versions")
    p.add_argument("--fix", action="append", help="audit only this fix id (repeatable)")
    p.add_argument("--package", action="append", default=None, metavar="NAME==VERSION",
                   help="a version of a third-party package fixes target, audited against each torch "
                        f"(repeatable; default: {' '.join(DEFAULT_PACKAGES)}; 'none' for none)")
    p.add_argument("--cache", default=str(REPO / ".distci" / "torch"),
                   help="root of the audit's stack envs (distci.provision.envs, one per stack), reused across audits "
                   "(default .distci/torch)")
    p.add_argument("--out", default=str(REPO / ".distci" / "audit"), help="where audit.json/audit.md go")
    p.add_argument("--report", default=None, help="also write the markdown table here (e.g. reports/fix-audit.md)")
    p.add_argument("--env", action="append", help="KEY=VALUE added to the environment of every run (repeatable)")
    p.add_argument("--python", default=None,
                   help="audit this interpreter's torch as installed instead of managed venvs (--torch ignored)")
    p.add_argument("--render", action="append", default=None, metavar="DIR",
                   help="print (and with --report write) the table of earlier audit directories (repeatable: "
                        "audits of disjoint versions run side by side are merged and judged together); runs nothing")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run")
    p.add_argument("--bisect", action="store_true", help="then bisect the releases between each obsolete "
                   "fix's last present and first absent version: which change made it obsolete")
    p.set_defaults(fn=_cmd)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distci.audit.run")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["fixes-audit", *(argv if argv is not None else sys.argv[1:])])
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
