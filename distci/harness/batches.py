"""Batches in one session: a pytest session that runs its selection, then waits for its
controller to name the next batch, collects again and runs that, until told to stop.

Load it beside the harness: `pytest -p distci.harness.plugin -p distci.harness.batches
--distci-batches=DIR`. Why: the fuzzer runs a night's draws and shrink rounds as batches of a
few cases, each decided by the outcomes of the one before, and as one pytest session each,
every batch paid pytest's start, the stack capture and its rank pools' start (every rank
imports torch, Dynamo and the suites: most of a small batch's CPU). One session pays them
once; the rank pools stay up between batches (`Pools.keep_idle`).

The exchange, files in DIR (distci/run/batches.py is the controller's side):
- the session writes `done-<n>` once batch n ran (batch 1 is what the command line selected;
  every result is in the run directory before the file appears);
- the controller writes `next-<n+1>.json` (atomically): `{"env": {NAME: VALUE}}` sets those
  variables and collects the first batch's test modules again (their `pytest_generate_tests`
  read the new batch from the environment), or `{"stop": true}` ends the session as usual.
  Of the tests collected again, a batch runs those of the first batch's test functions, or
  those `"tests": [NODE ID, ...]` names (test functions of those modules, a parametrization's
  id optional): the ops generator sends its sweeps and then its finds' replays, two test
  functions of one module, to one session.

Nothing carries over between batches that a test could see: every distributed test already
runs in a fresh fork of its rank template, and after a batch's last test every fixture is torn
down (it runs with no next item). A session that dies mid-batch (a crash of pytest itself)
leaves no `done` file: the controller records the cases without a result as `infra` and
starts a new session for the next batch.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from distci.harness.plugin import harness_of

POLL_S = 0.02  # how often a waiting side looks for the other's file: 50 stats a second, no CPU to speak of


def done_path(directory: Path, n: int) -> Path:
    return directory / f"done-{n:04d}"


def next_path(directory: Path, n: int) -> Path:
    return directory / f"next-{n:04d}.json"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("distci").addoption(
        "--distci-batches", default=None, metavar="DIR",
        help="after the selection ran, wait for DIR/next-<n>.json and run the next batch in this session "
             "(distci.harness.batches; the fuzzer's controller writes them)")


def _run_items(session: pytest.Session) -> None:
    """pytest's own run loop over session.items (the last item tears every fixture down)."""
    for i, item in enumerate(session.items):
        nextitem = session.items[i + 1] if i + 1 < len(session.items) else None
        item.config.hook.pytest_runtest_protocol(item=item, nextitem=nextitem)
        if session.shouldfail:
            raise session.Failed(session.shouldfail)
        if session.shouldstop:
            raise session.Interrupted(session.shouldstop)


def _items(node: pytest.Item | pytest.Collector) -> list[pytest.Item]:
    if isinstance(node, pytest.Item):
        node.ihook.pytest_itemcollected(item=node)
        return [node]
    return [item for child in node.collect() for item in _items(child)]


Wanted = set[tuple[Path, str]]
"""Tests a batch runs: (a module's path, a test function's name or one parametrization's)."""


def _key(item: pytest.Item) -> tuple[Path, str]:
    return item.path.resolve(), item.nodeid.split("::", 1)[-1]


def _named(config: pytest.Config, tests: list[str]) -> Wanted:
    """Node ids as the controller writes them (paths relative to where pytest started, or
    absolute), as keys `_selected` compares: the same module whatever its path's spelling."""
    base = config.invocation_params.dir
    return {((base / path).resolve(), name) for path, _, name in (t.partition("::") for t in tests)}


def _selected(item: pytest.Item, tests: Wanted) -> bool:
    path, name = _key(item)
    return (path, name) in tests or (path, name.split("[", 1)[0]) in tests


def _collect_again(session: pytest.Session, modules: list[pytest.Module], tests: Wanted) -> None:
    """The modules' tests collected anew (their parametrization is read again), those `tests`
    names kept, then selected as a first collection is (-k, -m, the harness's and the suites'
    hooks) and announced (the pools warm for them). The modules' nodes are kept, so conftest
    fixtures stay in sight (pytest 9 binds them to the directory nodes of the first collection)."""
    items = [item for module in modules for item in _items(module) if _selected(item, tests)]
    session.items = items
    config = session.config
    config.hook.pytest_collection_modifyitems(session=session, config=config, items=items)
    session.testscollected = len(items)
    config.hook.pytest_collection_finish(session=session)


def _await(directory: Path, n: int) -> dict:
    """The controller's word on batch n; a stop when the controller is gone."""
    parent = os.getppid()
    path = next_path(directory, n)
    while not path.exists():
        if os.getppid() != parent:
            return {"stop": True}
        time.sleep(POLL_S)
    command = json.loads(path.read_text())
    tests = command.get("tests") if isinstance(command, dict) else None
    if not isinstance(command, dict) or not (command.get("stop") or isinstance(command.get("env"), dict)) \
            or not (tests is None or isinstance(tests, list) and all(isinstance(t, str) for t in tests)):
        raise pytest.UsageError(f"{path}: expected {{\"env\": {{...}}, \"tests\": [NODE ID, ...] (optional)}} "
                                f"or {{\"stop\": true}}, got {command!r}")
    return command


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool | None:
    option = session.config.getoption("--distci-batches", default=None)
    if not option or session.config.option.collectonly or session.testsfailed or not session.items:
        return None  # pytest's own loop (which stops at collection errors)
    directory = Path(option)
    directory.mkdir(parents=True, exist_ok=True)
    harness = harness_of(session.config)
    if harness is not None:
        harness.pools.keep_idle = True  # a pool this batch does not need, the next may
    modules = list(dict.fromkeys(item.getparent(pytest.Module) for item in session.items))
    first = {(path, name.split("[", 1)[0]) for path, name in map(_key, session.items)}  # its test functions
    n = 1
    while True:
        _run_items(session)
        tmp = done_path(directory, n).with_suffix(".tmp")
        tmp.write_text("")
        tmp.rename(done_path(directory, n))
        n += 1
        command = _await(directory, n)
        if command.get("stop"):
            return True
        os.environ.update({str(k): str(v) for k, v in command["env"].items()})
        tests = command.get("tests")
        wanted = _named(session.config, tests) if tests is not None else first
        _collect_again(session, [m for m in modules if m is not None], wanted)
