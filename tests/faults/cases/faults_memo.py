"""What a fault case saw before it changed its process, for the case after it to compare.

A module global would not do: each test runs in a fresh fork of the rank worker, so a
case hands its observations on through a file per (run, name, rank), under
DISTCI_FAULT_DIR or the temp dir. Values are pickled: keep them plain (numbers, names).
"""

import os
import pickle
import tempfile


def _path(name: str, rank: int) -> str:
    root = os.environ.get("DISTCI_FAULT_DIR") or tempfile.gettempdir()
    token = os.environ.get("DISTCI_RUN_TOKEN", "no-token").replace("/", "_")
    return os.path.join(root, f"distci-fault-{token}-{name}-rank{rank}.pkl")


def remember(name: str, rank: int, value) -> None:
    with open(_path(name, rank), "wb") as fh:
        pickle.dump(value, fh)


def recall(name: str, rank: int):
    """What `remember` kept; KeyError when the case that keeps it did not run first on this rank."""
    try:
        with open(_path(name, rank), "rb") as fh:
            return pickle.load(fh)
    except FileNotFoundError:
        raise KeyError(f"{name}: the case that records it did not run first on rank {rank}") from None
