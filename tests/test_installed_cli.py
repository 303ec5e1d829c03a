"""`pip install distci` gives a CLI that starts: every command's --help in a fresh venv,
and `distci fuzz` drawing over a checkout's suites with distci imported from the wheel.

The venv holds distci's wheel and the dependencies pyproject.toml declares, nothing else
(no pytest, no Docker SDK, no checkout on the path): what a user or a CI runner gets. The
install uses the machine's pip configuration (its index or find-links), as any install does.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


ONE_CPU_CELL = """\
schema = 1

[accelerators.cpu]
backend = "gloo"
runner = ["ubuntu-latest"]
archs = ["x86_64"]
variants = ["cpu"]

[tiers.nightly]
blocking_suites = []

[[matrix]]
accelerator = "cpu"
torch = "2.13.0"
torchao = "0.18.0"
tiers = ["nightly"]
"""


def _listed(help_text: str, heading: str) -> list[str]:
    """The names a help text lists under `heading` (argparse's `{a,b,c}` or an indented list)."""
    if heading == "{":
        match = re.search(r"\{([a-z,-]+)\}", help_text)
        return match.group(1).split(",") if match else []
    block = help_text.split(heading, 1)[1]
    return re.findall(r"^  ([a-z][a-z-]*) ", block, flags=re.M)


@pytest.mark.slow
def test_every_command_help_works_from_the_wheel_without_pytest(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    built = _run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(wheels)], tmp_path)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("distci-*.whl")
    venv = tmp_path / "v"
    assert _run([sys.executable, "-m", "venv", str(venv)], tmp_path).returncode == 0
    python = str(venv / "bin" / "python")
    installed = _run([python, "-m", "pip", "install", "-q", str(wheel)], tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert _run([python, "-c", "import pytest"], tmp_path).returncode != 0, "the venv should not hold pytest"

    hub = _run([python, "-m", "distci", "--help"], tmp_path)
    assert hub.returncode == 0, hub.stderr
    commands = _listed(hub.stdout, "{")
    assert {"run", "gate", "ingest", "dashboard", "bisect", "images", "fuzz", "report"} <= set(commands)
    bisect = _run([python, "-m", "distci", "bisect", "--help"], tmp_path)
    modes = _listed(bisect.stdout, "modes:")
    assert {"versions", "commits", "compiler"} <= set(modes), bisect.stdout
    failed = {}
    for argv in [[c] for c in commands] + [["bisect", m] for m in modes]:
        proc = _run([python, "-m", "distci", *argv, "--help"], tmp_path)
        if proc.returncode != 0 or "usage:" not in proc.stdout:
            failed[" ".join(argv)] = (proc.returncode, proc.stderr.strip().splitlines()[-1:])
    assert not failed, f"--help fails in an installed distci: {failed}"

    # distci fuzz from the wheel: the engine is the package's, the axes the checkout's suites'
    # (a checkout holding only suites/ and a matrix, so no distci/ beside it can be imported).
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "suites", checkout / "suites", ignore=shutil.ignore_patterns("__pycache__"))
    (checkout / "matrix.toml").write_text(ONE_CPU_CELL)
    cell = _run([python, "-m", "distci", "matrix"], checkout).stdout.split()[0]
    where = _run([python, "-c", "import distci; print(distci.__file__)"], checkout).stdout
    assert str(venv) in where, where
    drawn = _run([python, "-m", "distci", "fuzz", "--cell", cell, "--list", "--max-configs", "3", "--seed", "s"],
                 checkout)
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    from distci.fuzz.command import list_draws
    from distci.fuzz.space import Space
    from suites.generators import space as cell_side

    assert drawn.stdout.split() == list_draws(Space(cell_side, device_type="cpu"), "s", 3)
