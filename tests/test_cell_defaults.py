"""Every command that takes a cell runs the default cell when none is named, as `distci run` does.

The parser table is walked, not listed: every option of every subcommand (bisect's modes
included) whose destination is a cell must be optional and say its default, unless it is
one of the few whose absence means something else (NOT_A_CELL_TO_RUN, each with why).
Then the commands that default are run with no cell and must name the default one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from distci.bisect.args import MODES, mode_parser
from distci.bisect.docker import add_options as add_backend_options
from distci.cli import build_parser
from distci.matrix import load_matrix

CELL_DESTS = {"cell", "image_cell"}
# (command, option) -> why its absence means something other than "the default cell".
NOT_A_CELL_TO_RUN = {
    ("export", "--cell"): "a filter over the store's rows: none exports every cell's",
    ("teardown", "--cell"): "a filter over this job's containers: none removes every cell's",
    ("aggregate bisect-result", "--cell"): "records the answer of a bisect CI dispatched for a named cell",
    **{(f"bisect {mode}", "--cell"): "a pin: the cell whose newest stored run pins the other packages; none pins "
                                     "nothing (the bisect says so), and a default cell's stack would be a wrong pin"
       for mode, (_, groups, _) in MODES.items() if mode != "compiler" and "store" in groups},
}


def _subparsers(parser: argparse.ArgumentParser, path: str = ""):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _subparsers(child, f"{path} {name}".strip())


def cell_options() -> dict[tuple[str, str], argparse.Action]:
    """(command, option) -> its argparse action, for every option whose destination is a cell."""
    parsers = list(_subparsers(build_parser()))
    parsers += [(f"bisect {mode}", mode_parser(mode, extra=add_backend_options)) for mode in MODES]
    return {(path, action.option_strings[0]): action for path, parser in parsers for action in parser._actions
            if action.dest in CELL_DESTS and action.option_strings}


def test_every_cell_option_defaults_to_the_default_cell():
    options = cell_options()
    assert {("run", "--cell"), ("images", "--cell"), ("fuzz", "--cell"), ("trainjob", "--cell"),
            ("sbatch-script", "--cell"), ("bisect compiler", "--cell"), ("bisect versions", "--image-cell")} <= set(
        options), sorted(options)
    assert set(NOT_A_CELL_TO_RUN) <= set(options), "an exemption names an option that no longer exists"
    wrong = [f"{command} {flag}" for (command, flag), action in options.items()
             if (command, flag) not in NOT_A_CELL_TO_RUN and (action.required or "default" not in (action.help or ""))]
    assert wrong == [], "these take a cell but do not default to the default cell (or do not say so)"


def distci(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distci", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_commands_given_no_cell_run_the_default_one(tmp_path):
    matrix = load_matrix(REPO / "matrix.toml")
    spread = matrix.default_cell(multi_node=True)
    assert spread.nodes > 1
    script = distci("sbatch-script")
    assert script.returncode == 0 and f"--cell {spread.id}" in script.stdout, script.stderr
    job = distci("trainjob", "--image", "registry.invalid/distci:cell")
    assert job.returncode == 0, job.stderr
    assert {"name": "DISTCI_CELL", "value": spread.id} in _env_entries(json.loads(job.stdout))

    dead = {"DOCKER_HOST": f"unix://{tmp_path}/dead.sock"}
    bisect = distci("bisect", "versions", "suites/test_tp_mlp.py::test_x", "--good", "2.12.0", "--bad", "2.13.0",
                    "--backend", "docker", env=dead)
    assert f"in the image of cell {matrix.default_cell().id} (the default cell" in bisect.stdout, bisect.stderr
    assert bisect.returncode == 2 and "Docker daemon not reachable" in bisect.stderr  # it got as far as the daemon
    images = distci("images", env=dead)
    assert images.returncode == 2 and "Docker daemon not reachable" in images.stderr, images.stderr
    assert "required" not in images.stderr


ONE_NODE_MATRIX = """schema = 1
[accelerators.cpu]
backend = "gloo"
runner = ["ubuntu-latest"]
archs = ["x86_64"]
variants = ["cpu"]
[tiers.pr]
[[matrix]]
accelerator = "cpu"
torch = "2.13.0"
tiers = ["pr"]
"""


def _env_entries(manifest) -> list:
    """Every {name, value} environment entry anywhere in a manifest."""
    if isinstance(manifest, dict):
        found = [manifest] if set(manifest) == {"name", "value"} else []
        return found + [e for v in manifest.values() for e in _env_entries(v)]
    return [e for v in manifest for e in _env_entries(v)] if isinstance(manifest, list) else []


def test_a_matrix_with_no_multi_node_cell_says_to_name_one(tmp_path):
    path = tmp_path / "matrix.toml"
    path.write_text(ONE_NODE_MATRIX)
    assert load_matrix(path).default_cell().nodes == 1
    proc = distci("--matrix", str(path), "sbatch-script")
    assert proc.returncode == 2 and "no multi-node cell (nodes > 1) to default to: name one with --cell" in proc.stderr
    assert "Traceback" not in proc.stderr
