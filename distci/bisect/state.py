"""The bisect state: every probe run so far, saved after each one.

A probe of a distributed test can take minutes, so an interrupted bisect (a killed CI
job, a laptop lid) must resume without probing again what it already knows. The engine
asks the state before calling a probe and records each run right after it returns; a
state bound to a file rewrites it atomically at every record, so the file is always a
complete, readable snapshot.

The file belongs to one question: `meta` says what was being tested (test id or command,
the pinned stack...), and a state file whose meta differs is refused rather than mixed in:
outcomes of another test would silently steer the search.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from distci.errors import BisectError, DistciError  # noqa: F401 - re-exported

STATE_VERSION = 1
OUTCOMES = ("good", "bad", "skip")




@dataclass
class ProbeRun:
    """One run of a probe on one candidate.

    `cached` is the probe's word on whether its environment was already built (warm), or
    None when it does not say. `reason` says why a run answered as it did when the
    answer is not the check's verdict: `timeout`, `infra` (the environment could not be
    built), `native` (no binary can hold the candidate). `resumed` marks a run read back from a state file instead of
    executed in this session; it is not saved, since in the file every run is just a run.
    """

    outcome: str
    seconds: float
    cached: bool | None = None
    detail: str = ""
    setup_seconds: float | None = None
    reason: str = ""
    resumed: bool = False

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise BisectError(f"probe outcome {self.outcome!r} is not one of {OUTCOMES}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        del data["resumed"]
        return data


class BisectState:
    """Probe runs by candidate key; bound to a JSON file when `path` is given."""

    def __init__(self, path: Path | str | None = None, meta: dict[str, Any] | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.meta: dict[str, Any] = _normalized(meta or {})
        self._runs: dict[str, list[ProbeRun]] = {}

    @classmethod
    def open(cls, path: Path | str, meta: dict[str, Any] | None = None) -> "BisectState":
        """The state saved at `path` if it exists (refused if it answers another
        question), else a new one that will be saved there."""
        state = cls(path, meta)
        if not state.path.exists():
            return state
        try:
            data = json.loads(state.path.read_text())
            version = data["version"]
            saved_meta = data["meta"]
            probes = data["probes"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BisectError(f"unreadable bisect state ({exc}); delete it to start over",
                              where=str(state.path)) from exc
        if version != STATE_VERSION:
            raise BisectError(f"bisect state version {version}, expected {STATE_VERSION}; "
                              "delete it to start over", where=str(state.path))
        if saved_meta != state.meta:
            raise BisectError(
                f"this state file belongs to another bisect ({_diff(saved_meta, state.meta)}); "
                "pass another --state path or delete it", where=str(state.path))
        for key, runs in probes.items():
            state._runs[key] = [ProbeRun(**run, resumed=True) for run in runs]
        return state

    def runs(self, key: str) -> list[ProbeRun]:
        return list(self._runs.get(key, ()))

    def keys(self) -> list[str]:
        return list(self._runs)

    def record(self, key: str, run: ProbeRun) -> None:
        self._runs.setdefault(key, []).append(run)
        if self.path is not None:
            self.save()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "meta": self.meta,
            "probes": {key: [run.to_dict() for run in runs] for key, runs in self._runs.items()},
        }

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path)


def _normalized(meta: dict[str, Any]) -> dict[str, Any]:
    """Meta as it reads back from JSON, so a fresh meta compares equal to a saved one."""
    try:
        return json.loads(json.dumps(meta, sort_keys=True))
    except TypeError as exc:
        raise BisectError(f"bisect meta must be JSON data: {exc}") from exc


def _diff(saved: dict[str, Any], now: dict[str, Any]) -> str:
    keys = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    return ", ".join(f"{k}: saved {saved.get(k)!r}, now {now.get(k)!r}" for k in keys)
