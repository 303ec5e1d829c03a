"""The session's rank pools: one per (world size, process-group timeout class), kept up for the
session, started ahead of their first test, told what to import before they fork, capped.

A pool's key is (world size, process-group timeout): classes are few (the default, and one per
long timeout marker), so each stays up for the session, under a cap on the ranks kept up at
once (idle pools beyond it are shut down, least recently used first). The default pool is
launched while pytest itself starts (`launch_ahead`), so its ranks import torch while the
controller imports and collects; once the selection is known (`warm`) each launched pool gets
the modules its tests import, to import before it forks (warm.py), or is stopped when no
selected test needs it. A pool that fails to start `max_starts` times in a row is not started
again: its later tests are `infra` at once.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from distci.harness.outcome import Combined
from distci.harness.pool import PoolStartError, RankPool
from distci.harness.protocol import TestRequest, Warm

PoolKey = tuple[int, float]  # (world size, process-group timeout)


@dataclass
class Pools:
    """Owns the pools of one pytest session (distci.harness.plugin's Harness keeps one)."""

    device_type: str
    log_dir: Path
    token: str
    isolate: bool
    env: dict[str, str]  # the ranks' extra environment (the compile cache's directory)
    max_starts: int
    max_live_ranks: int
    before_first_start: Callable[[], None] = lambda: None  # the Harness starts its reaper here
    pools: dict[PoolKey, RankPool] = field(default_factory=dict)
    last_used: dict[PoolKey, int] = field(default_factory=dict)  # key -> the test count when it last ran one
    failed_starts: dict[PoolKey, list[str]] = field(default_factory=dict)  # per pool: failed starts in a row
    modules: dict[PoolKey, list[str]] = field(default_factory=dict)  # per pool: what its tests import (warm)
    tests_run: int = 0

    def get(self, key: PoolKey) -> RankPool:
        if key not in self.pools:
            self.before_first_start()
            self.pools[key] = RankPool(key[0], self.device_type, self.log_dir, pg_timeout_s=key[1],
                                       token=self.token, isolate=self.isolate, env=self.env)
        return self.pools[key]

    def launch_ahead(self, key: PoolKey) -> None:
        """Spawns the pool of `key` now, without waiting for it (warm() tells it what to import)."""
        self.get(key).launch()

    def warm(self, modules: dict[PoolKey, list[str]]) -> None:
        """The selection's modules per pool, in run order: a launched pool is sent its own to
        import before it forks; one that no selected test needs is stopped."""
        self.modules = modules
        for key, pool in list(self.pools.items()):
            if not pool.ranks:
                continue
            if key in modules:
                pool.send_warm(Warm(modules[key], list(sys.path)))
            else:
                pool.kill()

    def make_room(self, key: PoolKey) -> None:
        """Shut idle pools down, least recently used first, until the pool of `key` fits
        under max_live_ranks beside those still up (a pool larger than the cap still starts:
        alone)."""
        live = [(k, p) for k, p in self.pools.items() if k != key and p.alive]
        ranks = sum(k[0] for k, _ in live)
        for k, p in sorted(live, key=lambda kp: self.last_used.get(kp[0], -1)):
            if ranks + key[0] <= self.max_live_ranks:
                break
            p.shutdown()
            ranks -= k[0]

    def run(self, request: TestRequest, key: PoolKey, timeout_s: float) -> Combined:
        """The test on the pool of `key`, started (or its start-up finished) first."""
        pool = self.get(key)
        self.tests_run += 1
        self.last_used[key] = self.tests_run
        failures = self.failed_starts.setdefault(key, [])
        if not pool.alive:
            self.make_room(key)
            if len(failures) >= self.max_starts:
                message = (f"not started: the {key[0]}-rank pool failed to start {len(failures)} times in a "
                           f"row (--distci-max-pool-starts={self.max_starts}), so this run stopped starting "
                           f"it; the last start: {failures[-1]}")
                return Combined("error", "infra", "PoolStartsExhausted", message,
                                f"PoolStartsExhausted: {key[0]}-rank pool")
        try:
            if not pool.alive:
                pool.start(Warm(self.modules.get(key) or [request.module], list(request.sys_path)))
            elif not pool.ready:  # launched ahead: its start-up ends here
                pool.await_ready()
        except PoolStartError as exc:
            failures.append(str(exc))
            return Combined("error", "infra", "PoolStartError", f"{exc}\n{exc.logs}",
                            f"PoolStartError: {exc}"[:300])
        failures.clear()
        return pool.run(request, timeout_s)

    def pids(self) -> list[int]:
        return [pid for pool in list(self.pools.values()) for pid in pool.pids()]

    def close(self, interrupted: bool) -> None:
        for pool in self.pools.values():
            if interrupted:
                pool.kill()  # its ranks are still inside the interrupted test
            else:
                pool.shutdown()
        self.pools.clear()
