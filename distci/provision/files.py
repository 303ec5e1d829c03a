"""File primitives the provision stage shares: a content digest, an exclusive lock, the
manifest's name. The wheelhouse, its size cap and the pip-configuration digest use them.
"""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Serialize builders of the same directory across processes (two nox runs at once).

    filelock's Unix lock is flock(2) on the file, as the hand-made lock was, so a lock held
    by an older distci still excludes this one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path)):
        yield


def try_file_lock(path: Path) -> FileLock | None:
    """The lock at `path` if nobody holds it (the caller releases it), else None: never waits."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return None
    return lock
