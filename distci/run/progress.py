"""Keeps a long step talking: a heartbeat line while nothing else reaches the terminal.

A wheelhouse download or a venv install can run for minutes without a line of output;
a CI log that stays silent that long looks hung and a person waiting at a terminal
cannot tell whether anything moves. `Heartbeat` wraps such a step (the provisioning
code itself stays as it is) and, whenever `interval_s` passes without a line, logs one:
what is running, for how long, and, when a probe can count the work (wheels installed
so far out of the wheelhouse's), the counts and an ETA.

Lines first: the same output reads right in a CI log and through the `[cell-id]`
prefixer. On a terminal (`StatusLine`, when stdout is a TTY) a live line under them is
redrawn every second with the same counts and ETA, and cleared before the next line.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, TextIO

from distci.results import format_duration

Log = Callable[[str], None]
# (done, total or None): what a probe reports about the step it watches.
Probe = Callable[[], "tuple[int, int | None]"]

# Under half of the 30 s the issue allows between two lines, so a busy machine's
# scheduling delays never stretch a silence past it.
DEFAULT_INTERVAL_S = 15.0


@dataclass(frozen=True)
class Tick:
    """One heartbeat: what runs, since when, and how far it got when that is known."""

    what: str
    elapsed_s: float
    done: int | None = None
    total: int | None = None

    def eta_s(self) -> float | None:
        """Remaining time at the pace so far; None until one unit of work is done."""
        if not self.done or not self.total or self.done >= self.total:
            return None
        return self.elapsed_s / self.done * (self.total - self.done)

    def line(self) -> str:
        text = f"{self.what}: still running after {format_duration(self.elapsed_s)}"
        if self.done is not None:
            text += f", {self.done}/{self.total}" if self.total else f", {self.done} so far"
            eta = self.eta_s()
            if eta is not None:
                text += f", about {format_duration(eta)} left"
        return text


class StatusLine:
    """One redrawn line at the bottom of a terminal (`\r`, erase to end of line)."""

    def __init__(self, stream: TextIO, prefix: str = "") -> None:
        self.stream = stream
        self.prefix = prefix
        self.shown = False
        self._lock = threading.Lock()

    @classmethod
    def for_stdout(cls, prefix: str = "") -> "StatusLine | None":
        """A status line on stdout when it is a terminal; None in CI logs and pipes."""
        return cls(sys.stdout, prefix) if sys.stdout.isatty() else None

    def show(self, text: str) -> None:
        """Redraws the line, cut to the terminal's width: a wrapped line could not be erased."""
        width = shutil.get_terminal_size((80, 24)).columns - 1
        with self._lock:
            self.stream.write(f"\r\x1b[K{(self.prefix + text)[:width]}")
            self.stream.flush()
            self.shown = True

    def clear(self) -> None:
        with self._lock:
            if self.shown:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self.shown = False


class Heartbeat:
    """`with Heartbeat("installing 17 wheels", log, probe=...) as hb:` around a long step.

    Call `hb.beat()` (or pass `hb.wrap(log)` to the step as its log) whenever the step
    writes a line itself; the heartbeat only speaks into silences. A probe that raises
    is ignored for that tick: counting is a courtesy, the line is the guarantee.
    """

    def __init__(self, what: str, log: Log, *, interval_s: float = DEFAULT_INTERVAL_S,
                 probe: Probe | None = None, clock: Callable[[], float] = time.monotonic,
                 status: StatusLine | None = None) -> None:
        self.what = what
        self.status = status
        self.log = log
        self.interval_s = interval_s
        self.probe = probe
        self.clock = clock
        self.started = clock()
        self.last_line = self.started
        self.ticks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def beat(self) -> None:
        with self._lock:
            self.last_line = self.clock()

    def wrap(self, log: Log) -> Log:
        """`log`, noting each line as a sign of life (and clearing the status line first)."""
        def logged(message: str) -> None:
            if self.status is not None:
                self.status.clear()
            log(message)
            self.beat()
        return logged

    def tick(self) -> Tick:
        done = total = None
        if self.probe is not None:
            try:
                done, total = self.probe()
            except Exception:  # noqa: BLE001 - a probe of a half-built directory may fail; the line goes out anyway
                done = total = None
        return Tick(self.what, self.clock() - self.started, done, total)

    def poll(self) -> bool:
        """Logs a heartbeat if `interval_s` passed since the last line; whether it did."""
        with self._lock:
            due = self.clock() - self.last_line >= self.interval_s
        if due:
            if self.status is not None:
                self.status.clear()
            self.log(self.tick().line())
            self.ticks += 1
            self.beat()
        elif self.status is not None:
            self.status.show(self.tick().line())
        return due

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, self.interval_s / 4)):
            self.poll()
        if self.status is not None:
            self.status.clear()

    def __enter__(self) -> "Heartbeat":
        self._thread = threading.Thread(target=self._run, name=f"heartbeat: {self.what}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def count_matching(directories: Callable[[], Iterable[Path]], pattern: str) -> int:
    """How many entries match `pattern` in the directories (looked up on each call)."""
    return sum(1 for d in directories() if d.is_dir() for _ in d.glob(pattern))


def installed_probe(envs_root: Path, total: int) -> Probe:
    """Counts the distributions installed so far (`*.dist-info`) in the newest venv under
    `envs_root`: the one being built (envs.py owns how venvs are named and keyed)."""
    def probe() -> tuple[int, int | None]:
        envs = sorted((p for p in Path(envs_root).iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        if not envs:
            return 0, total
        done = count_matching(lambda: envs[-1].glob("lib/python*/site-packages"), "*.dist-info")
        return min(done, total), total
    return probe


def downloaded_probe(root: Path) -> Probe:
    """Counts the wheels a wheelhouse build under `root` has saved so far (its temp directories)."""
    def probe() -> tuple[int, int | None]:
        return count_matching(lambda: root.glob(".tmp-*"), "*.whl"), None
    return probe
