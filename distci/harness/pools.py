"""The session's rank pools: one per world size, kept up for the session, started ahead of
their first test, told what to import before they fork, capped.

Each test runs in a fresh fork that joins a process group of its own (template.py), so the
process-group timeout (the test's class: the default, or one per long timeout marker) is the
fork's, not the pool's: one pool serves every class of its world size. Only the in-place
mode (`--distci-no-isolation`: one group for the pool's life) keeps a pool per (world size,
class). Pools stay up under a cap on the ranks kept up at once (idle pools beyond it are
shut down, least recently used first). The default pool is launched while pytest itself
starts (`launch_ahead`), so its ranks import torch while the controller imports and
collects; once the selection is known (`warm`) each launched pool gets the modules its tests
import, to import before it forks (warm.py), or is stopped when no selected test needs it,
and the selection's other pools that fit under the cap are launched too, in run order, so
their start-up overlaps the tests before theirs. A pool that fails to start `max_starts`
times in a row is not started again: its later tests are `infra` at once.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from distci.harness.outcome import Combined
from distci.harness.pool import DEFAULT_PG_TIMEOUT_S, PoolStartError, RankPool
from distci.harness.protocol import TestRequest, Warm

PoolKey = tuple[int, "float | None"]
"""(world size, process-group timeout): the timeout is None (any class) where tests run in forks."""


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
    keep_idle: bool = False  # a session serving batches (batches.py) keeps pools its selection does not need

    def key(self, world_size: int, pg_timeout_s: float) -> PoolKey:
        """The pool a test of this world size and process-group timeout runs on."""
        return world_size, (None if self.isolate else pg_timeout_s)

    def get(self, key: PoolKey, pg_timeout_s: float) -> RankPool:
        """The pool of `key` (made, not started, when new; `pg_timeout_s`: its start-up's group's)."""
        if key not in self.pools:
            self.before_first_start()
            self.pools[key] = RankPool(key[0], self.device_type, self.log_dir, pg_timeout_s=pg_timeout_s,
                                       token=self.token, isolate=self.isolate, env=self.env)
        return self.pools[key]

    def launch_ahead(self, world_size: int, pg_timeout_s: float) -> None:
        """Spawns the pool of this world size now, without waiting for it (warm() tells it what to import)."""
        self.get(self.key(world_size, pg_timeout_s), pg_timeout_s).launch()

    def warm(self, modules: dict[PoolKey, list[str]], first_pg_timeout: dict[PoolKey, float] | None = None) -> None:
        """The selection's modules per pool, in run order: a launched pool is sent its own to
        import before it forks; one that no selected test needs is stopped (kept under
        `keep_idle`: the next batch may need it; make_room still caps them); the others are
        launched now, first needed first, as long as they fit under max_live_ranks beside the
        pools up (none is shut down for it). `first_pg_timeout`: the process-group timeout of
        each pool's first test (its start-up's), by key."""
        self.modules = modules
        for key, pool in list(self.pools.items()):
            if not pool.ranks:
                continue
            if key in modules:
                pool.send_warm(Warm(modules[key], list(sys.path)))
            elif not self.keep_idle:
                pool.kill()
        for key, names in modules.items():
            live = sum(k[0] for k, p in self.pools.items() if p.ranks)
            if key in self.pools and self.pools[key].ranks:
                continue
            if live + key[0] > self.max_live_ranks:
                continue
            pg_timeout_s = (first_pg_timeout or {}).get(key) or key[1] or DEFAULT_PG_TIMEOUT_S
            self.get(key, pg_timeout_s).launch(Warm(names, list(sys.path)))

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

    def run(self, request: TestRequest, world_size: int, timeout_s: float) -> Combined:
        """The test on the pool of its world size (and class, in place), started (or its
        start-up finished) first."""
        pg_timeout_s = request.pg_timeout_s or DEFAULT_PG_TIMEOUT_S
        key = self.key(world_size, pg_timeout_s)
        pool = self.get(key, pg_timeout_s)
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
