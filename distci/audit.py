"""Fix audit: for every torch version and every fix, is the bug there and does the fix work?

For each version the audit reuses (or creates once) a venv with that torch and
distci-fixes installed, asks the fix package in that venv what it sees (detect() with
fixes off, the range decision, the status with fixes on), and runs each fix's
regression test twice through the harness: with `DISTCI_FIXES=none` and with
`DISTCI_FIXES=<that fix only>`. The verdict per fix and version:

    needed             off fails, on passes: the fix earns its keep here
    obsolete since X   off passes here and on every later version from X on
    not affected       off passes here, but a later version needs the fix
    broken             on fails (the fix does not fix, or breaks what worked)
    n/a                the test skipped itself on this stack
    infra              the environment or the run never came up

Results go to .distci/audit/<stamp>/ (audit.json, audit.md) and the terminal (rich).
`--report PATH` also writes the markdown table there (reports/fix-audit.md in the repo).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from distci.errors import ConfigError, InfraError

REPO = Path(__file__).resolve().parent.parent
FIXES_DIR = REPO / "fixes"
DEFAULT_VERSIONS = ("2.5.1", "2.6.0", "2.7.0", "2.8.0", "2.10.0", "2.13.0", "2.14.1")
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


@dataclass
class TestRun:
    """One pytest run of a regression test file in one mode."""

    outcome: str  # passed | failed | skipped | infra
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    message: str = ""
    seconds: float = 0.0


@dataclass
class AuditRow:
    fix: str
    torch: str
    test: str
    present: Optional[bool]
    in_range: Optional[bool]
    status: str
    off: TestRun
    on: TestRun
    verdict: str = ""


@dataclass
class Audit:
    versions: list[str]
    rows: list[AuditRow] = field(default_factory=list)
    autoload: dict[str, bool] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    started: str = ""
    seconds: float = 0.0


# --- environments ---------------------------------------------------------------------


def venv_python(root: Path, version: str) -> Path:
    return root / version / "bin" / "python"


def _run(cmd: Sequence[str], *, env: Optional[dict] = None, timeout: float = 3600, cwd: Path = REPO
         ) -> subprocess.CompletedProcess:
    return subprocess.run(list(map(str, cmd)), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _installed_torch(python: Path) -> Optional[str]:
    if not python.exists():
        return None
    proc = _run([python, "-c", "import importlib.metadata as m; print(m.version('torch'))"], timeout=120)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _fixes_stamp() -> str:
    return hashlib.sha256((FIXES_DIR / "pyproject.toml").read_bytes()).hexdigest()[:16]


def ensure_venv(root: Path, version: str, log=print) -> Path:
    """The venv for `version` under root/<version>: reused when its torch matches.

    torch is installed once (the default index serves CUDA builds for old versions;
    they run on CPU). distci-fixes is installed editable, so fix edits need no
    reinstall; it is reinstalled when fixes/pyproject.toml (its entry points) changed.
    """
    python = venv_python(root, version)
    have = _installed_torch(python)
    if have is None or have.split("+")[0] != version:
        log(f"[{version}] creating venv (torch=={version}, a few GB for CUDA builds)")
        proc = _run([sys.executable, "-m", "venv", "--clear", root / version], timeout=600)
        if proc.returncode != 0:
            raise InfraError(f"venv for torch {version} failed", log=proc.stderr[-4000:])
        extra = ["--extra-index-url", os.environ[TORCH_INDEX_ENV]] if os.environ.get(TORCH_INDEX_ENV) else []
        proc = _run([python, "-m", "pip", "install", "-q", f"torch=={version}", *VENV_PACKAGES, *extra], timeout=3600)
        if proc.returncode != 0:
            raise InfraError(f"pip install torch=={version} failed", log=proc.stderr[-4000:])
    stamp_file = root / version / ".distci-fixes-stamp"
    if not stamp_file.exists() or stamp_file.read_text() != _fixes_stamp():
        proc = _run([python, "-m", "pip", "install", "-q", "--no-deps", "-e", FIXES_DIR], timeout=600)
        if proc.returncode != 0:
            raise InfraError(f"installing distci-fixes into torch {version} failed", log=proc.stderr[-4000:])
        stamp_file.write_text(_fixes_stamp())
    return python


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


def _junit_counts(path: Path) -> tuple[int, int, int, str]:
    root = ET.parse(path).getroot()
    passed = failed = skipped = 0
    message = ""
    for case in root.iter("testcase"):
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            failed += 1
            if not message:
                message = f"{case.get('name')}: {(bad.get('message') or bad.text or '').strip()}"
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped, message


def run_test(python: Path, test: str, fixes: str, out: Path, extra_env: dict[str, str],
             timeout: float) -> TestRun:
    """One pytest run of `test` through the harness with DISTCI_FIXES=fixes."""
    junit = out / f"junit-{fixes.replace(',', '+')}.xml"
    log = out / f"pytest-{fixes.replace(',', '+')}.log"
    started = time.monotonic()
    cmd = [python, "-m", "pytest", "-p", "distci.harness", "-p", "no:cacheprovider", "-q", "-rfEs",
           test, f"--junitxml={junit}"]
    try:
        proc = _run(cmd, env=_env(fixes, extra_env), timeout=timeout)
        text = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        text = f"timeout after {timeout:.0f}s\n{exc.stdout or ''}"
        log.write_text(text)
        return TestRun("infra", message=f"timeout after {timeout:.0f}s", seconds=time.monotonic() - started)
    log.write_text(text)
    seconds = time.monotonic() - started
    if not junit.exists():
        return TestRun("infra", message=text.strip().splitlines()[-1] if text.strip() else "no output",
                       seconds=seconds)
    passed, failed, skipped, message = _junit_counts(junit)
    if failed:
        outcome = "failed"
    elif passed:
        outcome = "passed"
    elif skipped:
        outcome = "skipped"
    else:
        outcome = "infra"
        message = message or "no test ran"
    return TestRun(outcome, passed, failed, skipped, _first_line(message), seconds)


_KIND_PREFIX = re.compile(r"(?:Failed: )?\[(?:assert|exception|timeout|hang|crash|infra)\] ")


def _first_line(message: str, limit: int = 240) -> str:
    """The error as one line: a message's first sentence, its wrapped lines joined."""
    words: list[str] = []
    for line in message.splitlines():
        line = _KIND_PREFIX.sub("", line).strip()
        if line.startswith(("---", "Traceback", "[rank")):
            break
        if not line:
            if words:
                break
            continue
        words.append(line)
        text = " ".join(words)
        if len(text) >= limit or text.endswith((".", ")")):
            break
    return " ".join(" ".join(words).split())[:limit]


# --- verdicts -------------------------------------------------------------------------


def _version_key(version: str) -> Any:
    from packaging.version import Version

    return Version(version)


def judge(rows: list[AuditRow]) -> None:
    """Fill each row's verdict; needs all versions of a fix to place `obsolete since`."""
    by_fix: dict[str, list[AuditRow]] = {}
    for row in rows:
        by_fix.setdefault(row.fix, []).append(row)
    for fix_rows in by_fix.values():
        fix_rows.sort(key=lambda r: _version_key(r.torch))
        needed_at = [i for i, r in enumerate(fix_rows) if r.off.outcome == "failed"]
        last_needed = needed_at[-1] if needed_at else -1
        since = fix_rows[last_needed + 1].torch if last_needed + 1 < len(fix_rows) else None
        for i, row in enumerate(fix_rows):
            if "infra" in (row.off.outcome, row.on.outcome):
                row.verdict = "infra"
            elif row.on.outcome == "skipped" and row.off.outcome == "skipped":
                row.verdict = "n/a"
            elif row.on.outcome == "failed":
                row.verdict = "broken"
            elif row.off.outcome == "failed":
                row.verdict = "needed"
            elif i < last_needed:
                row.verdict = "not affected"
            else:
                row.verdict = f"obsolete since {since}"


# --- the audit ------------------------------------------------------------------------


def audit_version(version: str, root: Optional[Path], out: Path, only: Optional[set[str]],
                  extra_env: dict[str, str], timeout: float, log=print, python: Optional[Path] = None
                  ) -> tuple[list[AuditRow], Optional[bool]]:
    """Audit one torch: the managed venv root/<version>, or `python` as it is."""
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
    statuses = {r["id"]: r for r in on["report"]}
    rows = []
    for fix_id, test in off["tests"].items():
        if only and fix_id not in only:
            continue
        fout = vout / fix_id
        fout.mkdir(exist_ok=True)
        log(f"[{version}] {fix_id}: {test} with fixes off, then with {fix_id} on")
        run_off = run_test(python, test, "none", fout, extra_env, timeout)
        run_on = run_test(python, test, fix_id, fout, extra_env, timeout)
        record = statuses.get(fix_id, {})
        rows.append(AuditRow(fix=fix_id, torch=version, test=test, present=off["present"].get(fix_id),
                             in_range=off["range"].get(fix_id), status=record.get("status", "?"),
                             off=run_off, on=run_on))
    return rows, bool(on.get("autoload_hook")) and bool(on.get("fixes_module"))


def run_audit(versions: Sequence[str], root: Optional[Path], out_root: Path, only: Optional[set[str]] = None,
              extra_env: Optional[dict[str, str]] = None, timeout: float = 1800, log=print,
              python: Optional[Path] = None) -> Audit:
    """Audit `versions` in managed venvs under root, or (python given) that interpreter."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = out_root / stamp
    out.mkdir(parents=True, exist_ok=True)
    if python is not None:
        versions = [_installed_torch(python) or "unknown"]
    audit = Audit(versions=list(versions), started=stamp, env=dict(extra_env or {}))
    started = time.monotonic()
    for version in versions:
        rows, autoload = audit_version(version, root, out, only, extra_env or {}, timeout, log, python)
        audit.rows += rows
        if autoload is not None:
            audit.autoload[version] = autoload
    judge(audit.rows)
    audit.seconds = time.monotonic() - started
    (out / "audit.json").write_text(json.dumps(asdict(audit), indent=2) + "\n")
    (out / "audit.md").write_text(to_markdown(audit))
    latest = out_root / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(out.name)
    log(f"audit written to {out}")
    return audit


# --- rendering ------------------------------------------------------------------------


def _yes_no(value: Optional[bool]) -> str:
    return {True: "yes", False: "no", None: "?"}[value]


def _outcome(run: TestRun) -> str:
    counts = f"{run.passed}/{run.passed + run.failed + run.skipped}"
    return f"{run.outcome} ({counts})" if run.outcome in ("passed", "failed") else run.outcome


def to_markdown(audit: Audit) -> str:
    lines = [
        "# Fix audit",
        "",
        f"Torch versions: {', '.join(audit.versions)} (CPU, gloo, 2 ranks; run {audit.started}, "
        f"{audit.seconds / 60:.0f} min). Each fix's regression test ran through the harness with "
        "`DISTCI_FIXES=none` (off) and with only that fix on (on); off/on show passed/total test cases "
        "(a case that skips itself, such as a GPU-only one on CPU, counts in the total). "
        "`bug present` is the fix's detect() with fixes off; `fix applied` its status with fixes on.",
        "",
        *([f"Added to every run's environment: {', '.join(f'`{k}={v}`' for k, v in audit.env.items())}.", ""]
          if audit.env else []),
        "| fix | torch | bug present | fix applied | off | on | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in audit.rows:
        lines.append(f"| {row.fix} | {row.torch} | {_yes_no(row.present)} | {row.status} | "
                     f"{_outcome(row.off)} | {_outcome(row.on)} | {row.verdict} |")
    lines += ["", "## Upstream errors with fixes off", ""]
    for row in audit.rows:
        if row.off.outcome == "failed":
            lines.append(f"- {row.fix} @ {row.torch}: `{row.off.message.replace('`', chr(39))}`")
    broken = [r for r in audit.rows if r.verdict == "broken"]
    if broken:
        lines += ["", "## Failures with the fix on", ""]
        lines += [f"- {r.fix} @ {r.torch}: `{r.on.message.replace('`', chr(39))}`" for r in broken]
    lines += ["", "## torch.backends entry point (fixes armed by `import torch`)", ""]
    lines += [f"- torch {v}: {'yes' if ok else 'NO: call distci_fixes.apply()'}" for v, ok in audit.autoload.items()]
    return "\n".join(lines) + "\n"


def reload(out: Path) -> Audit:
    """An audit as written to `out` (audit.json), its messages re-read from the JUnit files."""
    data = json.loads((out / "audit.json").read_text())
    rows = []
    for raw in data.pop("rows"):
        row = AuditRow(**{**raw, "off": TestRun(**raw["off"]), "on": TestRun(**raw["on"])})
        for run, mode in ((row.off, "none"), (row.on, row.fix)):
            junit = out / row.torch / row.fix / f"junit-{mode}.xml"
            if junit.exists() and run.outcome == "failed":
                run.message = _first_line(_junit_counts(junit)[3])
        rows.append(row)
    return Audit(rows=rows, **data)


def print_table(audit: Audit) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fix audit")
    for column in ("fix", "torch", "bug present", "fix applied", "off", "on", "verdict"):
        table.add_column(column)
    colours = {"needed": "green", "broken": "red", "infra": "yellow"}
    for row in audit.rows:
        colour = colours.get(row.verdict, "cyan" if row.verdict.startswith("obsolete") else "white")
        table.add_row(row.fix, row.torch, _yes_no(row.present), row.status, _outcome(row.off), _outcome(row.on),
                      f"[{colour}]{row.verdict}[/{colour}]")
    Console().print(table)


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
    if args.render:
        audit = reload(Path(args.render))
        print_table(audit)
        if args.report:
            Path(args.report).write_text(to_markdown(audit))
        _bisect(args, audit)
        return 0
    audit = run_audit(_versions(args.torch), Path(args.cache), Path(args.out),
                      set(args.fix) if args.fix else None, _extra_env(args.env), args.timeout,
                      python=Path(args.python) if args.python else None)
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

    table = bisect_table(bisect_audit(audit.rows, out=Path(args.out)))
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
    p.add_argument("--cache", default=str(REPO / ".distci" / "torch"),
                   help="venvs per torch version, reused across audits (default .distci/torch/<version>)")
    p.add_argument("--out", default=str(REPO / ".distci" / "audit"), help="where audit.json/audit.md go")
    p.add_argument("--report", default=None, help="also write the markdown table here (e.g. reports/fix-audit.md)")
    p.add_argument("--env", action="append", help="KEY=VALUE added to the environment of every run (repeatable)")
    p.add_argument("--python", default=None,
                   help="audit this interpreter's torch as installed instead of managed venvs (--torch ignored)")
    p.add_argument("--render", default=None, metavar="DIR",
                   help="print (and with --report write) the table of an earlier audit directory; runs nothing")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per pytest run")
    p.add_argument("--bisect", action="store_true", help="then bisect the releases between each obsolete "
                   "fix's last present and first absent version: which change made it obsolete")
    p.set_defaults(fn=_cmd)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distci.audit")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["fixes-audit", *(argv if argv is not None else sys.argv[1:])])
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
