"""`-k` and `--test` checked against the suites' collected ids before a cell is provisioned.

A selection that matches nothing used to be found by the cell's own pytest, after the
wheelhouse and the env were made (minutes, cold). The ids are the checkout's, but
collecting them imports torch (every suite does) and the ids a generator draws can
follow the torch it imports, so they are known without the cell only where an
interpreter with the cell's torch is at hand:

- `--python`: the run's own interpreter (its preinstalled stack is the cell's);
- this controller's interpreter, when it has pytest and the torch release the cell pins;
- an env already provisioned under the env root with that release (a warm runner's).

That interpreter runs the cell's own pytest command (distci.run.cellrun.pytest_command:
same plugin, tier, device, world size) with `--collect-only -q`, about ten seconds. A
cell on a nightly, a git build or a wheelhouse, a machine with no such interpreter yet, or
a collection that fails (a CUDA cell collected by a CPU torch) is not checked: one line
says so and the run goes on as before, its pytest saying "no test selected" if so.

A check that selected tests is remembered (`Remembered`), keyed by everything a collection
reads: the interpreter and its torch release, the cell's pytest command and environment,
and the size and mtime of every file of the checkout's suites, distci and the selected
tests' folders. The same selection again (a repro pasted twice, a test of distci) is then
not collected again (about 3 CPU-seconds of every such run). A selection that matched
nothing is never remembered: it is collected again, and refused, every time. A stale
answer can only be "it matched": the run then goes on as it would with no check at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from distci.cells import Cell
from distci.errors import SelectionError

Log = Callable[[str], None]
KEPT_ANSWERS = 200  # remembered checks kept (newest first): every edit of the checkout starts new ones
CONFIG_FILES = ("pyproject.toml", "conftest.py", "pytest.ini", "setup.cfg", "tox.ini")

COLLECT_TIMEOUT_S = 180.0
PYTEST_OK, PYTEST_USAGE, PYTEST_NO_TESTS = 0, 4, 5
_PROBE = ("import importlib.metadata as m, pytest; "
          "print(m.version('torch').split('+')[0])")


@dataclass(frozen=True)
class Collector:
    """An interpreter that collects the suites as the cell would, and why it may."""

    python: str
    why: str


@dataclass(frozen=True)
class Collected:
    """What a collection said: how many tests the selection matched, or why it could not tell."""

    matched: int | None
    output: str = ""


def pinned_torch(cell: Cell) -> str | None:
    """The torch release the cell pins exactly (``==X``), else None (nightly, git, a range...)."""
    if cell.torch.kind != "release":
        return None
    match = re.fullmatch(r"==\s*([0-9][0-9A-Za-z.]*)", cell.torch.spec.strip())
    return match.group(1) if match else None


def torch_release(python: str) -> str | None:
    """The public torch version `python` imports with pytest beside it, else None."""
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def provisioned_pythons(env_root: Path, release: str) -> list[str]:
    """Interpreters of envs under `env_root` that hold torch `release` (found by its dist-info,
    no import): a warm runner's stack envs."""
    found = []
    for dist in sorted(env_root.glob(f"*/lib/python3*/site-packages/torch-{release}*.dist-info")):
        version = dist.name[len("torch-"):-len(".dist-info")].split("+")[0]
        python = dist.parents[3] / "bin" / "python"
        if version == release and python.exists():
            found.append(str(python))
    return found


def find_collector(cell: Cell, python: str | None, env_root: Path) -> Collector | str:
    """The interpreter that can collect `cell`'s ids here, or the reason none can."""
    if python:
        return Collector(python, "the run's --python")
    release = pinned_torch(cell)
    if release is None:
        return f"cell {cell.id} does not pin a torch release, so its ids are known once its env is up"
    if torch_release(sys.executable) == release:
        return Collector(sys.executable, f"this controller has torch {release}")
    for candidate in provisioned_pythons(env_root, release):
        if torch_release(candidate) == release:
            return Collector(candidate, f"a provisioned env has torch {release}")
    return f"no interpreter here has pytest and cell {cell.id}'s torch {release} yet (its env checks it)"


def collect(cell: Cell, collector: Collector, *, tests: Sequence[str], keyword: str | None, tier: str | None,
            timeout_s: float = COLLECT_TIMEOUT_S) -> Collected:
    """Run the cell's pytest command with --collect-only -q; the number of tests it selects,
    or matched=None when the collection itself failed (the cell's stack is needed)."""
    from distci.harness import procs
    from distci.provision.selfwheels import REPO
    from distci.run.cellrun import cell_environment, pytest_command

    with tempfile.TemporaryDirectory(prefix="distci-precheck-") as scratch:
        cmd = pytest_command(cell, Path(collector.python), Path(scratch), "precheck", tests=list(tests),
                             keyword=keyword, extra_args=["--collect-only", "-q"])
        env = {**os.environ, **cell_environment(cell, tier), "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)
        proc = procs.start_owned(cmd, env=env, token=procs.run_token(), cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            procs.kill_tree(proc)
            return Collected(None, f"collection took over {timeout_s:.0f}s")
        except KeyboardInterrupt:
            procs.stop(proc, signal.SIGINT, grace_s=5.0)
            raise
    if proc.returncode == PYTEST_NO_TESTS or (proc.returncode == PYTEST_USAGE and "not found:" in output):
        return Collected(0, output)
    if proc.returncode != PYTEST_OK:
        return Collected(None, output)
    counted = re.search(r"^(\d+)(?:/\d+)? tests? collected", output, re.M)
    return Collected(int(counted.group(1)) if counted else None, output)


@dataclass(frozen=True)
class Remembered:
    """Checks that selected tests, one file each under `folder`, named by the key of what
    their collection read (`key`); None where the inputs cannot be pinned down."""

    folder: Path

    def key(self, cell: Cell, collector: Collector, *, tests: Sequence[str], keyword: str | None,
            tier: str | None) -> str | None:
        from distci.harness.procs import RUN_TOKEN_ENV
        from distci.provision.selfwheels import REPO
        from distci.run.cellrun import cell_environment, pytest_command

        release = torch_release(collector.python)
        inputs = collection_inputs(REPO, list(tests) or list(cell.suites))
        if release is None or inputs is None:
            return None
        cmd = pytest_command(cell, Path(collector.python), Path("run-dir"), "precheck", tests=list(tests),
                             keyword=keyword, extra_args=["--collect-only", "-q"])
        # not the names of this process (the run token of a controller started owned, a test of
        # distci's or a nightly step's, is new each time: a key with it was never found again)
        own = (RUN_TOKEN_ENV, "PYTEST_CURRENT_TEST", "PYTEST_XDIST_")
        env = {k: v for k, v in os.environ.items() if k.startswith(("DISTCI_", "PYTEST_")) and not k.startswith(own)}
        env.update(cell_environment(cell, tier))
        seen = [os.path.realpath(collector.python), release, cmd, sorted(env.items()), inputs]
        return hashlib.sha256(json.dumps(seen).encode()).hexdigest()[:32]

    def matched(self, key: str | None) -> int | None:
        """How many tests the remembered check selected, or None when there is none."""
        if key is None:
            return None
        try:
            matched = json.loads((self.folder / f"{key}.json").read_text()).get("matched")
        except (OSError, ValueError, AttributeError):
            return None
        return matched if isinstance(matched, int) and matched > 0 else None

    def keep(self, key: str | None, matched: int) -> None:
        """Remembers a check that selected `matched` (> 0) tests; drops the oldest beyond KEPT_ANSWERS."""
        if key is None or matched <= 0:
            return
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, suffix=".tmp")
            with os.fdopen(fd, "w") as out:
                json.dump({"matched": matched}, out)
            os.replace(tmp, self.folder / f"{key}.json")
            answers = sorted(self.folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
            for old in answers[KEPT_ANSWERS:]:
                old.unlink(missing_ok=True)
        except OSError:  # a read-only or full disk: the next run checks again
            pass


def collection_inputs(repo: Path, tests: Sequence[str]) -> list[tuple[str, int, int]] | None:
    """(path, size, mtime) of every file a collection of `tests` may read in the checkout:
    suites/, distci/, the selected tests' top folders and the root's pytest configuration;
    None when a selected test lies outside the checkout (its folder is not ours to walk)."""
    roots = {"suites", "distci"}
    for test in tests:
        path = Path(test.split("::")[0])
        if path.is_absolute() or ".." in path.parts:
            return None
        if path.parts:
            roots.add(path.parts[0])
    found = []
    for name in sorted({*CONFIG_FILES, *(r for r in roots if (repo / r).is_file())}):
        if (repo / name).is_file():
            stat = (repo / name).stat()
            found.append((name, stat.st_size, stat.st_mtime_ns))
    for root in sorted(roots):
        for folder, dirs, files in os.walk(repo / root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            for name in sorted(files):
                path = Path(folder) / name
                try:
                    stat = path.stat()
                except OSError:
                    continue
                found.append((str(path.relative_to(repo)), stat.st_size, stat.st_mtime_ns))
    return found


def check_selection(cells: Sequence[Cell], *, tests: Sequence[str], keyword: str | None, tier: str | None,
                    python: str | None, env_root: Path, log: Log = print,
                    remembered: Remembered | None = None) -> None:
    """Raise SelectionError (one line: the selection, the cell, how to list ids) when `-k` /
    `--test` match no test of a cell whose ids can be known here; log why a cell was not checked.
    `remembered`: where checks that selected tests are kept, and found again."""
    from distci.run.cellrun import no_test_message
    from distci.run.externals import split_tests

    native, _ = split_tests(list(tests))
    if not keyword and not native:
        return
    chosen = " ".join(([f"-k {shlex.quote(keyword)}"] if keyword else []) + [f"--test {shlex.quote(t)}" for t in native])
    for cell in cells:
        if cell.external and keyword:
            log(f"{chosen}: not checked before provisioning: cell {cell.id} also runs external suites, "
                f"whose ids are known once they are fetched")
            continue
        collector = find_collector(cell, python, env_root)
        if isinstance(collector, str):
            log(f"{chosen}: not checked before provisioning: {collector}")
            continue
        key = remembered.key(cell, collector, tests=native, keyword=keyword, tier=tier) if remembered else None
        if remembered and (matched := remembered.matched(key)):
            log(f"{chosen}: {matched} test(s) of cell {cell.id} selected (checked before provisioning, "
                "as an earlier check of the same selection, suites and torch found)")
            continue
        found = collect(cell, collector, tests=native, keyword=keyword, tier=tier)
        if found.matched is None:
            log(f"{chosen}: not checked before provisioning: collecting cell {cell.id}'s suites here failed "
                f"(it needs the cell's own stack); its env checks it")
            continue
        if found.matched == 0:
            listing = shlex.join([*(["env", f"DISTCI_TIER={tier}"] if tier else []), collector.python, "-m", "pytest",
                                  "-p", "distci.harness.plugin", f"--distci-device={cell.accelerator}",
                                  "--collect-only", "-q", *cell.suites])
            raise SelectionError(f"{no_test_message(cell, native, keyword)}{f' (tier {tier})' if tier else ''}, "
                                 f"checked before provisioning ({collector.why}); list its test ids with: {listing}")
        if remembered:
            remembered.keep(key, found.matched)
        log(f"{chosen}: {found.matched} test(s) of cell {cell.id} selected (checked before provisioning)")
