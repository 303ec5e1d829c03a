"""The store's write lock, made visible: how long a writer waits, and who holds the lock.

SQLite says only "database is locked". Every distci transaction records its holder (pid,
host, command, since) in `<store>.writer`, so a writer that gives up after
DISTCI_STORE_LOCK_TIMEOUT seconds can say who it waited for. The file is a courtesy: a
failure to write it never fails a transaction, and SQLite's lock is the only lock.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import datetime, timezone
from pathlib import Path

from distci.errors import StoreError

LOCK_TIMEOUT_ENV = "DISTCI_STORE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 60.0
"""How long a writer waits for another writer's transaction before giving up (and saying
who holds the store): a nightly aggregate must not hang silently behind a stuck ingest."""
WRITER_SUFFIX = ".writer"


def lock_timeout_s() -> float:
    """DISTCI_STORE_LOCK_TIMEOUT (seconds), else DEFAULT_LOCK_TIMEOUT_S."""
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise StoreError(f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise StoreError(f"{LOCK_TIMEOUT_ENV}={raw!r} must be above 0 seconds")
    return value


def holder_of(writer_file: Path) -> str:
    """Who holds the write lock, as the writer file says."""
    try:
        data = json.loads(Path(writer_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "holder unknown: no writer file, not a distci process"
    if not isinstance(data, dict):
        return "holder unknown"
    alive = ""
    if data.get("host") == socket.gethostname() and isinstance(data.get("pid"), int):
        try:
            os.kill(data["pid"], 0)
        except ProcessLookupError:
            alive = ", no longer running: its lock is SQLite's to release"
        except PermissionError:
            pass
    return (f"pid {data.get('pid')} on {data.get('host')}, `{data.get('command', '?')}`, "
            f"since {data.get('since', '?')}{alive}")


def claim(writer_file: Path) -> None:
    """Records this process as the holder (called once the write lock is taken)."""
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)[:300],
              "since": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        tmp = writer_file.with_name(writer_file.name + f".{os.getpid()}")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        tmp.replace(writer_file)
    except OSError:
        pass


def release(writer_file: Path) -> None:
    """Removes the writer file when it names this process."""
    try:
        data = json.loads(writer_file.read_text(encoding="utf-8"))
        if isinstance(data, dict) and data.get("pid") == os.getpid() and data.get("host") == socket.gethostname():
            writer_file.unlink()
    except (OSError, ValueError):
        pass
