"""The CLI hub: an explicit registry of command modules that fails loudly, imported by no module."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from conftest import REPO
from distci import cli


def test_every_registered_module_registers_its_commands():
    parser = cli.build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)  # argparse keeps them here
    assert {"matrix", "run", "images", "teardown", "aggregate", "gate", "export", "dashboard", "ingest",
            "bisect"} <= commands


def test_a_module_that_does_not_import_is_an_error_naming_it():
    with pytest.raises(cli.CommandImportError, match=r"cannot load the commands of distci\.no_such_module"):
        cli.build_parser(registry=("distci.no_such_module",))
    with pytest.raises(cli.CommandImportError, match=r"distci\.errors is in distci\.cli\.REGISTRY but has no add_parser"):
        cli.build_parser(registry=("distci.errors",))


def test_the_new_modules_do_not_import_the_cli_hub():
    """distci.ci and distci.images sit below the hub (gate, store, dashboard still reach it lazily)."""
    offenders = []
    for path in [*(REPO / "distci" / "ci").glob("*.py"), *(REPO / "distci" / "images").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(n in ("distci.cli", "cli") or n.endswith(".cli") and n.startswith("distci") for n in names):
                offenders.append(path.name)
    assert offenders == []


def test_a_user_error_is_wrapped_to_the_terminal_width(monkeypatch) -> None:
    """`distci: error: ...` lines fit $COLUMNS (they were 259-271 columns): wrapped at
    spaces, continuations indented; a word longer than a line (a path) stays whole."""
    from distci.errors import SelectionError, error_text

    monkeypatch.setenv("COLUMNS", "80")
    why = "the cell " + "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on " * 5 + "is not in matrix.toml; see `nox -s matrix`"
    lines = error_text(SelectionError(why, where="matrix.toml:12")).splitlines()
    assert len(lines) > 1 and all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("distci: error: matrix.toml:12: the cell") and lines[1].startswith("    ")
    assert " ".join(line.strip() for line in lines) == f"distci: error: matrix.toml:12: {why}"
    proc = subprocess.run([sys.executable, "-m", "distci", "gate", "--store", "no/such/store.sqlite",
                           "--matrix", "no/such/matrix.toml"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "40"}, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("distci: error:")
    assert all(len(line) <= 40 for line in proc.stderr.splitlines()), proc.stderr
