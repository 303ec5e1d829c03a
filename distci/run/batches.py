"""A cell's pytest kept for a run's batches: the controller's side of distci/harness/batches.py.

The fuzzer decides each batch from the outcomes of the one before, so its batches cannot be
one selection; as one pytest each, every batch paid pytest's start and its rank pools' (the
ranks import torch, Dynamo and the suites: measured in docs/benchmarks.md). A BatchSession
starts the cell's pytest once, with the first batch, and hands it each later batch through
the files the harness side waits for; its results land in the run directory as any test's.

Crash safety: a batch ends when the session says it ran, or when the session's pytest ended
(a crash of pytest itself, a stop). The cases it did not record have no Result (the caller
records them `infra`); the ended pytest is closed as `run_in_env` closes one (`finish_run`:
one that recorded nothing is an `infra` Result), and the next batch starts a new session. A
rank that dies is the harness's to handle inside the session, as in any run: the test is a
`crash`, the pool is rebuilt, and the next test runs in a fresh fork.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from distci.cells import Cell
from distci.harness import procs
from distci.harness.batches import POLL_S, done_path, next_path
from distci.rundir import RunDir, RunInfo, Selection
from distci.run.cellrun import finish_run, start_pytest
from distci.run.fitting import cell_tag
from distci.run.terminal import relay_pytest

BATCHES_PLUGIN = "distci.harness.batches"
STOP_GRACE_S = 120.0  # a session told to stop closes its pools and writes its JUnit; then it is killed


class BatchSession:
    """Runs batches of `entry_test` in one pytest of a started cell run (see the module doc).

    `run(env)` runs one batch, its variables set in the session's environment (the entry
    test's parametrization reads them); `close()` ends the session (always call it: a
    `with` block does). `log` gets what run_in_env's would (the command, pytest's lines)."""

    def __init__(self, cell: Cell, python: Path, info: RunInfo, run_dir: Path, *, entry_test: str,
                 extra_args: list[str], directory: Path, log: Callable[[str], object]) -> None:
        self.cell, self.python, self.info, self.run_dir = cell, python, info, run_dir
        self.entry_test, self.extra_args, self.root, self.log = entry_test, list(extra_args), directory, log
        self.proc: subprocess.Popen | None = None
        self.relay: threading.Thread | None = None
        self.code: int | None = None
        self.directory = directory
        self.batch = 0  # the running session's batches so far
        self.sessions = 0  # pytest processes started (1 unless one died)

    def __enter__(self) -> "BatchSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(interrupted=exc[0] is not None)

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run(self, env: dict[str, str], tests: list[str] | None = None) -> None:
        """One batch: sent to the session (started with it when none is up); returns once the
        session says it ran, or once the session ended. `tests`: node ids of test functions of
        the entry test's module to run instead of the entry test (the ops generator's finds,
        replayed after its sweeps)."""
        with procs.stop_signals_raise():
            try:
                if self.up:
                    self._send({"env": env, **({"tests": tests} if tests is not None else {})})
                else:
                    self._ended()
                    self._start(env, tests or [self.entry_test])
                self._await_batch()
            except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM: pytest records the test in flight
                self._stop(getattr(signal, str(stop), signal.SIGINT) if str(stop).startswith("SIG") else signal.SIGINT)
                raise

    def close(self, interrupted: bool = False) -> None:
        """Ends the session: told to stop (killed after STOP_GRACE_S), or stopped at once when
        `interrupted`; run.json then says how its pytest ended."""
        if self.proc is None:
            return
        if self.up and not interrupted:
            self._send({"stop": True})
            try:
                self.proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                procs.stop(self.proc, signal.SIGTERM)
        elif self.up:
            self._stop(signal.SIGINT)
        self._ended()

    # -- the exchange -----------------------------------------------------------------
    def _start(self, env: dict[str, str], tests: list[str]) -> None:
        self.sessions += 1
        self.directory = self.root / f"session-{self.sessions:03d}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.batch = 1
        self.info.selection = Selection(None, tuple(tests), None, ()).to_list()
        args = [*self.extra_args, "-p", BATCHES_PLUGIN, f"--distci-batches={self.directory}"]
        self.proc, width = start_pytest(self.cell, self.python, self.info, self.run_dir, tests=tests,
                                        extra_args=args, env=env, log=self.log)
        rundir, proc, tag = RunDir(self.run_dir), self.proc, cell_tag(self.cell.id)

        def relay() -> None:
            self.code = relay_pytest(proc, rundir.pytest_log, rundir.results_path, lambda m: self.log(f"{tag}{m}"),
                                     width=width)

        self.relay = threading.Thread(target=relay, name="distci-batch-relay", daemon=True)
        self.relay.start()

    def _send(self, command: dict) -> None:
        self.batch += 1
        path = next_path(self.directory, self.batch)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(command))
        tmp.rename(path)  # whole or absent: the session never reads half a command

    def _await_batch(self) -> None:
        done = done_path(self.directory, self.batch)
        while not done.exists() and self.up:
            time.sleep(POLL_S)
        if not done.exists():
            self._ended()

    def _stop(self, sig: int) -> None:
        if self.up:
            procs.stop(self.proc, sig)
        self._ended()

    def _ended(self) -> None:
        """A session whose pytest has ended (or none): relayed to its last line, closed as a run's
        pytest is (finish_run)."""
        if self.proc is None or self.proc.poll() is None:
            return
        if self.relay is not None:
            self.relay.join()
            self.relay = None
        code = self.code if self.code is not None else self.proc.returncode
        finish_run(self.cell, self.info, self.run_dir, code)
        self.proc = None
