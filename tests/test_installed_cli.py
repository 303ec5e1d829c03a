"""`pip install distci` gives a CLI that starts: every command's --help in a fresh venv.

The venv holds distci's wheel and the dependencies pyproject.toml declares, nothing else
(no pytest, no Docker SDK, no checkout on the path): what a user or a CI runner gets. The
install uses the machine's pip configuration (its index or find-links), as any install does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


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
