"""`nox -s bench -- provision`: how long the default CPU cell's environment takes, cold and warm.

The goal it checks (issue 17): from a warm wheelhouse, the CPU torch 2.13.0 env in at
most 30 s (pip took ~200 s on the shared 2-core machine), and a second cell on the same
stack (the fix_off twin) ready in at most 5 s. Every phase starts from new directories
under ``.distci/bench-provision/`` so "cold" means cold:

    wheelhouse cold   a new wheelhouse dir: pip downloads the stack (index or local disk)
    env, uv cold      a new env root and a new uv cache: the first env on a fresh runner
    env, uv warm      another new env root, uv's cache now filled
    second cell       the twin's whole provisioning step (key, wheelhouse reuse, selfwheels,
                      env reuse), as `distci run` does it
    env, pip          (with --pip) the pip fallback into a new env root, for comparison

Figures, the machine's load average and the date go to ``.distci/bench-provision.json``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from distci.run.cellrun import provision, stack_inputs
from distci.provision.envs import ensure_env
from distci.matrix import load_matrix
from distci.provision.selfwheels import build_all
from distci.provision.wheelhouse import ensure_wheelhouse

REPO = Path(__file__).resolve().parents[2]
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
TWIN = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"
ENV_GOAL_S = 30.0
SECOND_GOAL_S = 5.0


@dataclass
class Phase:
    name: str
    seconds: float


def _timed(name: str, fn) -> tuple[Phase, object]:
    started = time.monotonic()
    value = fn()
    return Phase(name, round(time.monotonic() - started, 1)), value


def run_provision_bench(console: Console, *, with_pip: bool = False, keep: bool = False) -> int:
    matrix = load_matrix(REPO / "matrix.toml")
    cell, twin = matrix.cell(CELL), matrix.cell(TWIN)
    work = REPO / ".distci" / "bench-provision"
    work.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix=time.strftime("%Y%m%dT%H%M%S-"), dir=work))
    load_before = os.getloadavg()
    say = lambda m: console.print(f"  {m}", highlight=False)  # noqa: E731
    phases: list[Phase] = []
    try:
        _, reqs, args = stack_inputs(cell)
        own = build_all(REPO / ".distci" / "selfwheels", log=say)
        console.print(f"bench provision: {CELL} -> {base}")
        phase, wheelhouse = _timed("wheelhouse cold", lambda: ensure_wheelhouse(reqs, args, base / "wheelhouse",
                                                                                log=say))
        phases.append(phase)
        uv_cache = base / "uv-cache"
        previous = os.environ.get("UV_CACHE_DIR")
        os.environ["UV_CACHE_DIR"] = str(uv_cache)
        try:
            phase, env = _timed("env, uv cold", lambda: ensure_env(wheelhouse, root=base / "envs-1", extra_wheels=own,
                                                                   log=say))
            phases.append(phase)
            phase, _ = _timed("env, uv warm", lambda: ensure_env(wheelhouse, root=base / "envs-2", extra_wheels=own,
                                                                 log=say))
            phases.append(phase)
            run_dir = base / "run"
            run_dir.mkdir()
            phase, twin_env = _timed("second cell", lambda: provision(twin, run_dir, wheelhouse_root=base / "wheelhouse",
                                                                      env_root=base / "envs-2", log=say))
            phases.append(phase)
        finally:
            if previous is None:
                os.environ.pop("UV_CACHE_DIR", None)
            else:
                os.environ["UV_CACHE_DIR"] = previous
        if with_pip:
            phase, _ = _timed("env, pip", lambda: ensure_env(wheelhouse, root=base / "envs-pip", extra_wheels=own,
                                                             installer="pip", log=say))
            phases.append(phase)
        shared = Path(twin_env.path).parent == base / "envs-2"
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    load_after = os.getloadavg()
    by_name = {p.name: p.seconds for p in phases}
    summary = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cell": CELL, "twin": TWIN, "wheels": len(wheelhouse.wheels),
        "load_avg_1m": [round(load_before[0], 1), round(load_after[0], 1)], "cpus": os.cpu_count(),
        "phases": [asdict(p) for p in phases], "twin_shares_env": shared,
    }
    table = Table(title=f"provision: {CELL} ({len(wheelhouse.wheels)} wheels)")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    for p in phases:
        table.add_row(p.name, f"{p.seconds:.1f}")
    console.print(table)
    out = REPO / ".distci" / "bench-provision.json"
    out.write_text(json.dumps(summary, indent=1) + "\n")
    console.print(f"load average (1 min) {summary['load_avg_1m'][0]} -> {summary['load_avg_1m'][1]} on "
                  f"{os.cpu_count()} CPUs; written {out}")
    ok = by_name["env, uv cold"] <= ENV_GOAL_S and by_name["second cell"] <= SECOND_GOAL_S and shared
    console.print(f"goals (env from a warm wheelhouse <= {ENV_GOAL_S:.0f} s, second cell on the stack <= "
                  f"{SECOND_GOAL_S:.0f} s, one env per stack): " + ("met" if ok else "NOT met"))
    return 0 if ok else 1
