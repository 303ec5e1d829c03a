"""`python -m distci.external ...`: run the declared external suites, or prepare their sources.

    python -m distci.external run [--suite NAME] [--test ID] [-k TEXT] [--cell-id ID]
        [--device cuda] [--fixes on|off|IDS] [--fix-package DIR|WHEEL] [--source NAME=DIR]
        [--ref NAME=REF] [--run-dir DIR | --runs-root DIR]
    python -m distci.external prepare NAME --dest DIR [--ref REF | --version X]

`run` uses the current interpreter as the cell environment (run it with the cell's
python) and writes results.jsonl, junit.xml, stack.json and run.json to the run
directory, exactly where a cell run writes its native results. `prepare` copies a
suite's upstream sources (only what the suite keeps) into a directory, e.g. one that is
carried to a machine with no access to the upstream repository.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Sequence

from distci.errors import ConfigError, DistciError
from distci.rundir import RunDir, RunInfo

from distci.external.spec import DEFAULT_PATH, load_suites


def _pairs(values: Sequence[str] | None, flag: str) -> dict[str, str]:
    out = {}
    for item in values or ():
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise ConfigError(f"{flag} takes NAME=VALUE (got {item!r})")
        out[name] = value
    return out


def _device(requested: str | None) -> str:
    if requested:
        return requested
    from distci.harness.devices import detect_device_type

    return detect_device_type()


def _select(suites, names: Sequence[str] | None):
    if not names:
        return suites
    known = {s.name for s in suites}
    for n in names:
        if n not in known:
            raise ConfigError(f"no external suite '{n}'; declared: {', '.join(sorted(known))}")
    return [s for s in suites if s.name in names]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def cmd_run(args: argparse.Namespace) -> int:
    from distci.external.runner import ExternalRun, Interrupted, run_external

    suites = _select(load_suites(args.suites), args.suite)
    cell_id = args.cell_id or os.environ.get("DISTCI_CELL") or "local"
    run_id = args.run_id or f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:6]}-{cell_id}"
    run_dir = Path(args.run_dir) if args.run_dir else Path(args.runs_root) / run_id
    known = Path(args.known_issues) if args.known_issues else (Path("suites") / "known_issues.toml")
    run = ExternalRun(
        run_dir=run_dir.resolve(), run_id=run_id, cell_id=cell_id, device_type=_device(args.device),
        python=args.python or sys.executable, fixes=args.fixes, fix_packages=[Path(p) for p in args.fix_package or ()],
        slots=args.slots, sources={k: Path(v) for k, v in _pairs(args.source, "--source").items()},
        refs=_pairs(args.ref, "--ref"), select=args.test or (), keyword=args.k,
        known_issues=known if known.exists() else None,
    )
    started = _now()
    try:
        results = run_external(suites, run, world_size=args.world_size)
    except (Interrupted, KeyboardInterrupt) as exc:
        print(f"distci: external run stopped ({exc or 'SIGINT'}); what ran is in {run.run_dir}", file=sys.stderr)
        return 130 if isinstance(exc, KeyboardInterrupt) else 143
    rundir = RunDir(run.run_dir)
    if not rundir.info_path.exists():
        rundir.write_info(RunInfo(run_id=run_id, cell_id=cell_id, started_at=started, ended_at=_now(),
                                  runner=os.environ.get("DISTCI_RUNNER") or socket.gethostname(), backend="external",
                                  command=" ".join(sys.argv)))
    counts = {o: sum(r.outcome == o for r in results) for o in ("passed", "failed", "error", "skipped")}
    print(f"external: {len(results)} results in {run.run_dir}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    if any(r.outcome in ("failed", "error") and r.failure_kind != "infra" and not r.known_issue for r in results):
        return 1
    return 3 if any(r.failure_kind == "infra" for r in results) else 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from distci.external.fetch import UpstreamRef, prepared_record, ensure_checkout, prepare, upstream_ref

    (suite,) = _select(load_suites(args.suites), [args.name])
    if args.ref:
        ref = UpstreamRef(suite.package, args.version, args.ref)
    else:
        if args.version:
            version = args.version
        else:
            from importlib import metadata

            try:
                version = metadata.version(suite.package)
            except metadata.PackageNotFoundError:
                raise ConfigError(f"{suite.package} is not installed here; pass --version or --ref") from None
        ref = upstream_ref(suite, {"version": version})
    checkout = ensure_checkout(suite, ref)
    dest = Path(args.dest)
    size = prepare(checkout, suite.keep, dest)
    missing = prepared_record(dest).get("missing") or []
    print(f"{suite.name}: {checkout.ref} ({checkout.commit or '?'}) -> {dest} ({size / 1e6:.1f} MB)"
          + (f"; not in the upstream sources: {', '.join(missing)}" if missing else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m distci.external", description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default=str(DEFAULT_PATH), help="the external-suites file")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run the declared external suites in this interpreter's environment")
    p.add_argument("--suite", action="append", help="a suite name (repeatable); default: all")
    p.add_argument("--test", action="append", help="a test id or glob (repeatable)")
    p.add_argument("-k", default=None, help="only test ids containing this text")
    p.add_argument("--cell-id", default=None, help="the cell these results belong to (default: $DISTCI_CELL or local)")
    p.add_argument("--run-id", default=None)
    p.add_argument("--run-dir", default=None, help="write here (default: RUNS_ROOT/RUN_ID)")
    p.add_argument("--runs-root", default=".distci/runs")
    p.add_argument("--device", choices=("cpu", "cuda", "npu"), default=None)
    p.add_argument("--python", default=None, help="the cell's python (default: this one)")
    p.add_argument("--slots", type=int, default=None, help="devices available (default: what the stack reports)")
    p.add_argument("--world-size", type=int, default=2, help="processes a cpu cell runs (default: 2)")
    p.add_argument("--fixes", default="on", help="on | off | all | none | id1,id2 (DISTCI_FIXES)")
    p.add_argument("--fix-package", action="append", help="a fix package (project dir or wheel) to run with")
    p.add_argument("--source", action="append", help="NAME=DIR: take a suite's upstream sources from DIR")
    p.add_argument("--ref", action="append", help="NAME=REF: check a suite's upstream out at REF")
    p.add_argument("--known-issues", default=None)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("prepare", help="copy a suite's upstream sources (what it keeps) into a directory")
    p.add_argument("name")
    p.add_argument("--dest", required=True)
    p.add_argument("--ref", default=None, help="a git ref (default: the tag of --version or the installed version)")
    p.add_argument("--version", default=None)
    p.set_defaults(fn=cmd_prepare)
    return parser


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # A job timeout sends SIGTERM: unwind, so the running launch's session is killed too.
    signal.signal(signal.SIGTERM, _stop)
    try:
        return args.fn(args)
    except DistciError as exc:
        print(f"distci.external: {exc}", file=sys.stderr)
        return 2
