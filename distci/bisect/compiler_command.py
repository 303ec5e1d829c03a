"""`distci bisect --compiler`: torch's compiler bisector on a command or a test id.

The failing environment is the bad candidate's (built like a probe's), else --in-env;
for a test id with neither, the stack env of --cell (default: the pr tier's cell), built
or reused as a cell run builds it, so `nox -s bisect -- TEST_ID --compiler` works from
the controller's venv, which has no torch; for a command, this interpreter's. A test id runs through the harness in torchrun mode, like a
probe; the finding (backend, subsystem, pass or op) is written as a report under
--out/compiler and, for a test id, attached to the store as a bisect record whose
culprit is the finding, so the dashboard shows it next to the failure.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from distci.bisect.args import BisectArgs
from distci.bisect.compiler import compiler_bisect
from distci.bisect.install import EnvCache, InstallFailed
from distci.bisect.state import BisectError
from distci.provision.envs import env_python


def cell_env_python(cell_id: str | None, out: Path, log: Callable[[str], None]) -> tuple[str, Path]:
    """(cell id, the interpreter of its stack env): one env per stack, shared with its runs."""
    from distci.run.cellrun import provision
    from distci.errors import DistciError
    from distci.matrix import load_matrix
    from distci.provision.selfwheels import REPO

    matrix = load_matrix(REPO / "matrix.toml")
    if cell_id:
        cell = matrix.cell(cell_id)
    else:
        cell = matrix.default_cell()
    log(f"compiler bisect in the stack env of cell {cell.id} (--cell CELL or --in-env VENV for another)")
    where = out / "compiler" / "provision" / cell.id
    where.mkdir(parents=True, exist_ok=True)
    try:
        return cell.id, Path(provision(cell, where, log=log).python)
    except DistciError as exc:
        raise BisectError(f"the stack env of cell {cell.id} cannot be built: {exc} (log: {where})") from None


def run_compiler(args: BisectArgs, q: Any, log: Callable[[str], None]) -> int:
    from distci.bisect.question import args_digest, candidates_of, env_cache, harness_command, harness_path

    env: dict[str, str] = {}
    cache = env_cache(args, q, log) if args.bad is not None or q.pins is not None else None
    if args.bad is not None and q.source != "git":
        bad = candidates_of(args, replace(q, first=None), first=None, last=args.bad)[-1]
        log(f"compiler bisect in the environment of {bad.label}")
        try:
            venv, _ = cache.ensure(bad.key, lambda: cache.wheel_install(bad))  # type: ignore[union-attr]
        except InstallFailed as failed:
            raise BisectError(f"the failing environment cannot be built: {failed}") from None
        python = str(env_python(venv))
    elif args.in_env:
        python = str(env_python(Path(args.in_env)))
    elif q.test_id:
        cell_id, env_path = cell_env_python(args.cell, Path(args.out), log)
        python, q = str(env_path), replace(q, cell_id=cell_id)
    else:
        python = sys.executable
        if importlib.util.find_spec("torch") is None:
            raise BisectError("this interpreter has no torch: name the failing environment with "
                              "--in-env VENV (it needs pytest for a test id), or --bad X (with "
                              "--stack or --base-env) to build it")
    env["PYTHONPATH"] = str(harness_path(cache or EnvCache(Path(args.cache)), log))
    if q.test_id:
        command = harness_command(q.test_id)
        env["DISTCI_FIXES"] = q.fixes_mode or "none"
    else:
        command = q.command or ""
    finding = compiler_bisect(command, python=python, cwd=Path.cwd(), env=env,
                              start_backend=args.compiler_backend, timeout=args.timeout,
                              repeats=args.repeats, confirm=args.confirm, log=log)
    log(f"compiler bisector ({finding.runs} runs, {finding.seconds:.0f}s, torch {finding.torch}): "
        f"{finding.describe()}")
    log("this search assumes one flip: along the backends (eager .. inductor) the original failure, once "
        "it appears, stays; a backend is named only where the failure is the original one")
    report = Path(args.report) if args.report else Path(args.out) / "compiler" / (
        args_digest([command, python]) + ".json")
    report.parent.mkdir(parents=True, exist_ok=True)
    data = {"kind": "compiler", "command": command, "test": q.test_id, "regression": q.regression, "python": python,
            **finding.to_dict()}
    if q.test_id:  # the store's bisect keys: the dashboard shows the finding with the test
        data.update(test_id=q.test_id, axis="compiler", good="", bad=args.bad or "",
                    culprit=finding.describe(), cell_id=q.cell_id, status="compiler",
                    created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    report_path=str(report))
    report.write_text(json.dumps(data, indent=1) + "\n")
    log(f"report: {report}")
    if q.test_id and (q.regression or args.store):
        from distci.judge.ingest import read_bisect
        from distci.judge.store import Store

        with Store(args.store) as store:
            store.add_bisects(read_bisect(report))
        log("store: compiler finding recorded")
    if finding.status != "found":
        print(f"distci: bisect: no compile pass named ({finding.status}): {finding.reason}", file=sys.stderr)
    return 0 if finding.backend and finding.status == "found" else 1
