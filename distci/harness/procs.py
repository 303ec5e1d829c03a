"""Killing a launch and everything under it.

torchrun's agent starts each rank in a session of its own, so killing the launch's
process group alone would orphan the ranks; the tree is found through /proc instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (from /proc), children before grandchildren."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launch, its process group and every descendant (whatever session it is in)."""
    for pid in [*descendants(proc.pid), proc.pid]:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    proc.wait()
