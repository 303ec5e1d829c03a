"""The CLI hub: an explicit registry of command modules that fails loudly, imported by no module."""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys

import pytest

from conftest import REPO
from distci import cli


def _registered(parser) -> dict[str, str]:
    """name -> help line of the hub's subcommands (argparse keeps them on the subparsers action)."""
    action = parser._subparsers._group_actions[0]
    return {a.dest: a.help for a in action._choices_actions}


def test_every_registered_module_registers_exactly_its_commands_and_help():
    """COMMANDS lists each command's help line so `distci --help` imports nothing; the module
    that owns the command must register the same name with the same line."""
    for module in dict.fromkeys(c.module for c in cli.COMMANDS):
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        cli.register(sub, module)
        declared = {c.name: c.help for c in cli.COMMANDS if c.module == module}
        assert _registered(parser) == declared, module
    assert {"matrix", "run", "images", "teardown", "aggregate", "gate", "export", "dashboard", "ingest",
            "bisect"} <= set(_registered(cli.build_parser()))


def test_the_hub_imports_only_the_module_of_the_command_it_runs():
    code = ("import sys; from distci import cli; cli.build_parser(load={'gate'}); "
            "print(sorted(c.module for c in cli.COMMANDS if c.module in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert proc.stdout.split() == ["['distci.publish.gate']"]
    assert cli.command_of(["--matrix", "m.toml", "gate", "--tier", "pr"]) == "gate"
    assert cli.command_of(["--help"]) is None


def test_a_module_that_does_not_import_is_an_error_naming_it():
    broken = (cli.Command("nope", "distci.no_such_module", "h"),)
    with pytest.raises(cli.CommandImportError, match=r"cannot load the commands of distci\.no_such_module"):
        cli.build_parser(registry=broken)
    cli.build_parser(registry=broken, load=set())  # listing it imports nothing, so no error yet
    with pytest.raises(cli.CommandImportError, match=r"distci\.errors is in distci\.cli\.COMMANDS but has no add_parser"):
        cli.build_parser(registry=(cli.Command("e", "distci.errors", "h"),))


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
    """`distci: error: ...` lines fit the terminal (they were 259-271 columns): wrapped at
    spaces, continuations indented; a word longer than a line (a path) stays whole. Into a
    pipe the error stays one line (what a CI log greps for)."""
    import pty

    from distci.errors import SelectionError, error_text

    why = "the cell " + "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on " * 5 + "is not in matrix.toml; see `nox -s matrix`"
    lines = error_text(SelectionError(why, where="matrix.toml:12"), width=80).splitlines()
    assert len(lines) > 1 and all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("distci: error: matrix.toml:12: the cell") and lines[1].startswith("    ")
    assert " ".join(line.strip() for line in lines) == f"distci: error: matrix.toml:12: {why}"
    command = [sys.executable, "-m", "distci", "gate", "--store", "no/such/store.sqlite",
               "--matrix", "no/such/matrix.toml"]
    piped = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "40"},
                           cwd=REPO, timeout=120)
    assert piped.returncode == 2 and len(piped.stderr.splitlines()) == 1, piped.stderr
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=secondary, cwd=REPO,
                            env={**os.environ, "COLUMNS": "40"})
    os.close(secondary)
    text = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        text += chunk
    os.close(primary)
    assert proc.wait(timeout=120) == 2
    shown = text.decode().replace("\r\n", "\n").splitlines()
    assert len(shown) > 1 and all(len(line) <= 40 for line in shown), shown
