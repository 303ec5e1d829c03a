"""The wheelhouse's size cap: least-recently-used entries are evicted once the root holds
more than DISTCI_WHEELHOUSE_MAX_GB, never one in use (its lock is held) or used lately.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from distci.errors import ConfigError
from distci.provision.files import MANIFEST, file_lock, try_file_lock

Log = Callable[[str], None]


LAST_USED = ".last-used"


MAX_GB_VAR = "DISTCI_WHEELHOUSE_MAX_GB"


MIN_IDLE_S = 600.0


def max_bytes(max_gb: float | None = None) -> int | None:
    """The root's size cap: `max_gb`, else DISTCI_WHEELHOUSE_MAX_GB, else None (no cap)."""
    if max_gb is None:
        raw = os.environ.get(MAX_GB_VAR, "").strip()
        if not raw:
            return None
        try:
            max_gb = float(raw)
        except ValueError:
            raise ConfigError(f"{MAX_GB_VAR}={raw!r} is not a number of gigabytes (e.g. 50)") from None
    if max_gb <= 0:
        raise ConfigError(f"{MAX_GB_VAR} must be positive (got {max_gb})")
    return int(max_gb * 1e9)


def touch(path: Path) -> None:
    """Stamp a wheelhouse as used now (the LRU clock)."""
    stamp = path / LAST_USED
    stamp.touch()
    os.utime(stamp)


def last_used(path: Path) -> float:
    for candidate in (path / LAST_USED, path / MANIFEST, path):
        with contextlib.suppress(OSError):
            return candidate.stat().st_mtime
    return 0.0


def tree_size(path: Path) -> int:
    total = 0
    for entry in path.rglob("*"):
        with contextlib.suppress(OSError):
            if entry.is_file() and not entry.is_symlink():
                total += entry.stat().st_size
    return total


@dataclass(frozen=True)
class Entry:
    path: Path
    size: int
    last_used: float


def entries(root: Path) -> list[Entry]:
    """Complete wheelhouses under `root`, least recently used first."""
    found = [Entry(p, tree_size(p), last_used(p)) for p in root.iterdir()
             if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).is_file()] if root.is_dir() else []
    return sorted(found, key=lambda e: e.last_used)


def evict(root: Path, cap: int, *, keep: Sequence[Path] = (), min_idle_s: float = MIN_IDLE_S,
          now: float | None = None, log: Log = print) -> list[Path]:
    """Delete least-recently-used wheelhouses until `root` holds at most `cap` bytes.

    Skips `keep`, wheelhouses used within `min_idle_s` and ones whose builder holds their
    lock. A deleted wheelhouse is renamed away first, so no reader sees it half gone.
    """
    root = Path(root)
    now = time.time() if now is None else now
    kept = {Path(p).resolve() for p in keep}
    evicted: list[Path] = []
    with file_lock(root / ".evict.lock"):
        found = entries(root)
        total = sum(e.size for e in found)
        for entry in found:
            if total <= cap:
                break
            if entry.path.resolve() in kept or now - entry.last_used < min_idle_s:
                continue
            if _remove_unlocked(root, entry.path):
                total -= entry.size
                evicted.append(entry.path)
                log(f"wheelhouse {entry.path.name}: evicted ({entry.size / 1e9:.2f} GB, least recently used)")
        if total > cap:
            log(f"wheelhouse root {root}: {total / 1e9:.2f} GB is over the {cap / 1e9:.2f} GB cap "
                f"({MAX_GB_VAR}); what remains is in use")
    return evicted


def _remove_unlocked(root: Path, path: Path) -> bool:
    lock = try_file_lock(root / f".{path.name}.lock")
    if lock is None:
        return False
    try:
        doomed = root / f".evicting-{os.getpid()}-{path.name}"
        try:
            os.rename(path, doomed)
        except OSError:
            return False
        shutil.rmtree(doomed, ignore_errors=True)
        return True
    finally:
        lock.release()
