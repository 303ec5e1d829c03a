"""File primitives the provision stage shares: a content digest, an exclusive lock, the
manifest's name. The wheelhouse, its size cap and the pip-configuration digest use them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
from pathlib import Path
from typing import Iterator

MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Serialize builders of the same directory across processes (two nox runs at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
