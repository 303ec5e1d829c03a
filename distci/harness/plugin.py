"""The pytest plugin: runs `dist` tests on rank workers and records every outcome.

Load it with `pytest -p distci.harness.plugin`. A test is distributed when it takes the
`dist` argument or carries `@pytest.mark.world_size(n)`; its body runs on every rank
of a persistent RankPool (or under torchrun with `@pytest.mark.torchrun`). Everything
else runs in the pytest process as usual.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

from typing import Any

import pytest

from distci.harness.compile_cache import CACHE_ENV, compile_cache_env
from distci.harness.devices import detect_device_type, device_capability, device_kind, guess_device_type
from distci.harness.outcome import Combined
from distci.harness import procs
from distci.harness.pools import Pools
from distci.harness.protocol import TestRequest
from distci.harness.recorder import Recorder
from distci.harness.warm import COMPILER
from distci.harness.timeouts import USER_TIMEOUT, describe_load, load_retry_factor, take_over_timeout_markers
from distci.harness.torchrun import launch

DEFAULT_TIMEOUT_S = 300.0
PG_TIMEOUT_MARGIN_S = 60.0
PG_TIMEOUT_FLOOR_S = 5.0
DEFAULT_MAX_POOL_STARTS = 3
DEFAULT_MAX_LIVE_RANKS = 12
"""Rank workers kept up at once by one session, over all its pools (one per world size;
per world size and process-group timeout class in place). When each class had a pool of
its own, a nightly tier's ten classes left up were ~20 workers of ~0.5 GB each with a CUDA
build of torch: two shard jobs on a 24 GB runner ran out of memory and a collective starved
past its timeout (torch 2.15.0, 2026-12-05). Idle pools beyond the cap are shut down, least
recently used first; they start again when a test needs them."""

MARKERS = (
    "world_size(n): run the test body on n ranks of the rank pool",
    "dist_timeout(seconds): per-test timeout (default 300 s); the process-group timeout follows it (stays below it)",
    "requires_accelerator(name): skip unless the run's accelerator is `name` (cpu|cuda|npu)",
    "requires_sm(major_minor): skip unless the CUDA device capability is at least this (e.g. 90)",
    "torchrun(nproc=2): launch the test with torchrun; the test owns its process group",
    "compiles: the test compiles with inductor: its rank templates import Dynamo and inductor before "
    "they fork (tests that do not say so teach the templates after their first compile)",
    "timeout(seconds): pytest-timeout's marker; on a distributed test it is distci's per-test timeout "
    "(as dist_timeout), enforced on the ranks, never in the controller",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("distci", "distci distributed harness")
    group.addoption("--distci-device", default=None, help="cpu|cuda|npu (default: DISTCI_DEVICE or what is present)")
    group.addoption("--distci-world-size", type=int, default=2, help="world size for `dist` tests without a marker")
    group.addoption("--distci-timeout", type=float, default=None, help=f"default per-test timeout (s), default {DEFAULT_TIMEOUT_S}")
    group.addoption("--distci-timeout-cap", type=float, default=None,
                    help="upper bound on every test's timeout, markers included (fast runners: "
                         "the suites' markers are sized for 2 CPU cores); $DISTCI_TEST_TIMEOUT_CAP")
    group.addoption("--distci-mode", choices=("pool", "torchrun"), default="pool",
                    help="run every distributed test through the rank pool (default) or one torchrun per test")
    group.addoption("--distci-no-isolation", action="store_true",
                    help="run every test in the rank workers themselves instead of a fresh fork of them, one "
                         "process group for the pool's life (only to show what isolation prevents)")
    group.addoption("--distci-run-dir", default=None, help="write results.jsonl, junit.xml, stack.json and rank logs here")
    group.addoption("--distci-cell", default=None, help="cell id recorded with every result")
    group.addoption("--distci-run-id", default=None, help="run id recorded with every result")
    group.addoption("--distci-known-issues", default=None, help="known-issues registry (TOML) to match failures against")
    group.addoption("--distci-max-pool-starts", type=int, default=DEFAULT_MAX_POOL_STARTS,
                    help="stop starting a pool after this many failed starts in a row; its later tests are "
                         f"`infra` at once (like pytest-xdist's --max-worker-restart; default {DEFAULT_MAX_POOL_STARTS})")
    group.addoption("--distci-max-live-ranks", type=int, default=None,
                    help="rank workers kept up at once over all pools; idle pools beyond it are shut down, least "
                         f"recently used first ($DISTCI_MAX_LIVE_RANKS, default {DEFAULT_MAX_LIVE_RANKS})")
    group.addoption("--distci-reruns", type=int, default=0,
                    help="rerun a failed distributed test up to N times on the same (rebuilt if needed) pool; "
                         "a pass after a failure is recorded as passed with the earlier attempts (cell runs pass 1)")
    group.addoption("--distci-skip-done", default=None, metavar="FILE",
                    help="leave out the tests listed in FILE (one node id a line): those with an answer in "
                         "the runs a `distci run --resume` continues")


def _check_fix_selection() -> None:
    """An unknown id in DISTCI_FIXES is a configuration error here, before any rank starts
    (`import torch` in the ranks would only warn and apply nothing)."""
    try:
        import distci_fixes
    except ImportError:
        return  # a stack without the fix package: DISTCI_FIXES means nothing in it
    try:
        distci_fixes.check_env()
    except distci_fixes.UnknownFixError as err:
        raise pytest.UsageError(str(err)) from None


HARNESS = pytest.StashKey["Harness"]()  # the session's Harness, in config.stash as pytest's own plugins keep state


def harness_of(config: pytest.Config) -> "Harness | None":
    """The Harness of this pytest session (None when the plugin is not loaded)."""
    return config.stash.get(HARNESS, None)


def pytest_configure(config: pytest.Config) -> None:
    _check_fix_selection()
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    harness = Harness(config)
    config.stash[HARNESS] = harness
    config.pluginmanager.register(harness.recorder, "distci-recorder")
    harness.take_stop_signals()


@pytest.hookimpl(tryfirst=True)  # before the recorder's stack capture imports torch here: they overlap
def pytest_sessionstart(session: pytest.Session) -> None:
    harness = harness_of(session.config)
    if harness is not None:  # every pytest_configure has run (distci.launch may have chosen torchrun)
        harness.prestart()


def pytest_collection_finish(session: pytest.Session) -> None:
    harness = harness_of(session.config)
    if harness is not None:
        harness.warm_pools(session.items)


@pytest.hookimpl(trylast=True)  # after the suites' tier and shard selection: a resume keeps their share
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    take_over_timeout_markers(items, is_distributed)
    path = config.getoption("--distci-skip-done", default=None)
    if not path:
        return
    try:
        done = {line.strip() for line in Path(path).read_text().splitlines() if line.strip()}
    except OSError as exc:
        raise pytest.UsageError(f"--distci-skip-done {path}: {exc.strerror or exc}") from None
    drop = [item for item in items if item.nodeid in done]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item.nodeid not in done]


def pytest_unconfigure(config: pytest.Config) -> None:
    harness = harness_of(config)
    if harness is not None:
        harness.close()
        harness.release_stop_signals()
        del config.stash[HARNESS]


class _ControllerPlaceholder:
    """What `dist` is in the pytest process: nothing. Each rank receives its real DistContext."""

    def __getattr__(self, name: str):
        raise RuntimeError("`dist` is only usable inside a distributed test body running on the ranks")


@pytest.fixture
def dist():
    return _ControllerPlaceholder()


def is_distributed(item: pytest.Item) -> bool:
    return isinstance(item, pytest.Function) and (
        "dist" in item.fixturenames or item.get_closest_marker("world_size") is not None
        or item.get_closest_marker("torchrun") is not None
    )


def skip_reason(harness: "Harness", item: pytest.Item) -> str | None:
    """Why this runner skips `item` before it runs (another accelerator, an older SM, fewer
    devices than its ranks), if it does: pytest_runtest_setup skips it, and no pool starts for it."""
    acc = item.get_closest_marker("requires_accelerator")
    if acc and acc.args and harness.device_type not in acc.args:
        return f"needs accelerator {'/'.join(acc.args)}; this run is on {harness.device_type}"
    sm = item.get_closest_marker("requires_sm")
    if sm and sm.args:
        need = int(sm.args[0])
        cap = device_capability(harness.device_type)
        have = cap[0] * 10 + cap[1] if cap else None
        if have is None or have < need:
            return f"needs CUDA SM{need}+; this device is {'SM' + str(have) if have else harness.device_type}"
    if is_distributed(item) and harness.too_few_devices(n := harness.world_size_of(item)):
        return f"needs {n} {harness.device_type} devices; {harness.device_count()} visible"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    reason = skip_reason(item.config.stash[HARNESS], item)
    if reason:
        pytest.skip(reason)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    if not is_distributed(pyfuncitem):
        return None
    harness = pyfuncitem.config.stash[HARNESS]
    combined = harness.run_with_reruns(pyfuncitem)
    harness.recorder.remember(pyfuncitem.nodeid, combined)
    if combined.outcome == "passed":
        return True
    if combined.outcome == "skipped":
        pytest.skip(combined.message or "skipped on the ranks")
    pytest.fail(combined.render(), pytrace=False)


class Harness:
    """Owns the pools (one per world size) and the run-wide settings."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        opt = config.getoption
        self.device_type = opt("--distci-device") or guess_device_type() or detect_device_type()
        device_kind(self.device_type)
        self.default_world_size = opt("--distci-world-size")
        self.default_timeout = opt("--distci-timeout") or float(os.environ.get("DISTCI_TEST_TIMEOUT", DEFAULT_TIMEOUT_S))
        cap = opt("--distci-timeout-cap") or os.environ.get("DISTCI_TEST_TIMEOUT_CAP")
        self.timeout_cap = float(cap) if cap else None
        self.mode = opt("--distci-mode")
        self.isolate = not opt("--distci-no-isolation")
        run_dir = opt("--distci-run-dir")
        # Without a run directory the rank logs go to a scratch directory of this run's own:
        # two sessions in one checkout must never read each other's log lines as their own.
        self.scratch = not run_dir
        self.run_dir = Path(run_dir) if run_dir else scratch_dir(Path(config.rootpath))
        self._run_dir_lock = None if self.scratch else lock_run_dir(self.run_dir)
        self.keep_scratch = False  # a failed test's full rank logs stay for reading
        self.log_dir = self.run_dir / "logs"
        self.reruns = max(0, opt("--distci-reruns") or 0)
        self.token = procs.run_token()
        self.reaper: procs.Reaper | None = None
        # One torchrun launch per test: `launch` on this host; a plugin that places ranks on
        # several hosts (distci.launch.plugin) puts its own here, with the same signature.
        self.launcher = launch
        cap = opt("--distci-max-live-ranks") or os.environ.get("DISTCI_MAX_LIVE_RANKS")
        self.compile_cache = compile_cache_env(self.run_dir)
        self.pools = Pools(self.device_type, self.log_dir, self.token, self.isolate, env=self.compile_cache,
                           max_starts=max(1, opt("--distci-max-pool-starts") or DEFAULT_MAX_POOL_STARTS),
                           max_live_ranks=int(cap) if cap else DEFAULT_MAX_LIVE_RANKS,
                           before_first_start=self.start_reaper)
        self.recorder = Recorder(config, self.run_dir)
        self._device_count: int | None = None
        self._previous_handlers: dict[int, Any] = {}

    def take_stop_signals(self) -> None:
        """SIGINT, SIGTERM and SIGHUP (Ctrl-C, a CI or job timeout) all stop the run one way.

        pytest then ends the session properly: the test in flight is recorded as
        interrupted, JUnit is written and the ranks are killed. By default these signals
        would end the controller on the spot and lose all three; SIGINT is taken too, as a
        shell starts background jobs with SIGINT ignored (no KeyboardInterrupt at all).
        Only the main thread can take signals.
        """
        if threading.current_thread() is not threading.main_thread():
            return

        stopping: list[int] = []

        def stop(signum: int, _frame: Any) -> None:
            if stopping:  # the same stop again (see procs.stop_signals_raise): let pytest close
                return
            stopping.append(signum)
            self.recorder.stopped_by = signal.Signals(signum).name
            self.kill_ranks_now()
            raise KeyboardInterrupt(self.recorder.stopped_by)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._previous_handlers[sig] = signal.signal(sig, stop)

    def kill_ranks_now(self) -> None:
        """SIGKILL every pool rank's tree at once, touching no pool state (this runs in a
        signal handler): the ranks are gone within the stop's first second, however long
        pytest then takes to write its records. close() tidies up after."""
        for pid in self.pools.pids():
            procs.kill_pids([*procs.descendants(pid), pid])

    def release_stop_signals(self) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()

    def device_count(self) -> int:
        if self._device_count is None:
            try:
                self._device_count = device_kind(self.device_type).count()
            except Exception:  # noqa: BLE001 - e.g. torch_npu missing: no device
                self._device_count = 0
        return self._device_count

    def runner_problem(self) -> str | None:
        """Why this runner cannot run distributed tests at all (an infra failure), if it can't."""
        if self.device_type != "cpu" and self.device_count() == 0:
            return f"no {self.device_type} device is visible on this runner"
        return None

    def world_size_of(self, item: pytest.Item) -> int:
        m = item.get_closest_marker("world_size")
        if m and m.args:
            return int(m.args[0])
        t = item.get_closest_marker("torchrun")
        if t:
            return int(t.kwargs.get("nproc", t.args[0] if t.args else self.default_world_size))
        return self.default_world_size

    def timeout_of(self, item: pytest.Item) -> float:
        m = item.get_closest_marker("dist_timeout")
        timeout = float(m.args[0]) if m and m.args else item.stash.get(USER_TIMEOUT, self.default_timeout)
        return min(timeout, self.timeout_cap) if self.timeout_cap else timeout

    def request_for(self, item: pytest.Function) -> TestRequest:
        kwargs = {}
        for name in item._fixtureinfo.argnames:  # the test function's own arguments
            if name == "dist":
                continue
            value = item.funcargs[name]
            try:
                pickle.dumps(value)
            except Exception as exc:  # noqa: BLE001
                raise pytest.UsageError(
                    f"{item.nodeid}: argument {name!r} cannot be sent to the ranks ({exc}); "
                    "distributed tests take only picklable parameters and fixtures"
                ) from None
            kwargs[name] = value
        return TestRequest(
            nodeid=item.nodeid,
            module=item.module.__name__,
            qualname=item.obj.__qualname__,
            kwargs=kwargs,
            sys_path=list(sys.path),
            isolate=self.isolate,
            timeout_s=self.timeout_of(item),
            pg_timeout_s=self.pg_timeout_of(self.timeout_of(item)),
        )

    def pg_timeout_of(self, timeout: float) -> float:
        """The process-group timeout for a test of this timeout. A test no longer than the
        default shares the default class (below the default timeout; the test's own deadline
        comes first and its stacks tell hang from slow); a longer marker gets a class of its
        own below its timeout, so a long wait in a collective is not cut short as a hang."""

        def below(t: float) -> float:
            return max(PG_TIMEOUT_FLOOR_S, t - min(PG_TIMEOUT_MARGIN_S, t / 4))

        return max(below(self.default_timeout), below(timeout))

    def start_reaper(self) -> None:
        """The reaper that kills what outlives this controller, started with the first ranks."""
        if self.reaper is None:
            self.reaper = procs.Reaper(self.token)

    def default_pg_timeout(self) -> float:
        """The process-group timeout of a test with no timeout marker."""
        timeout = min(self.default_timeout, self.timeout_cap) if self.timeout_cap else self.default_timeout
        return self.pg_timeout_of(timeout)

    def pool_key(self, item: pytest.Item) -> tuple[int, float | None] | None:
        """The pool a distributed test runs on (None: a torchrun launch, or not distributed)."""
        if not is_distributed(item) or self.mode == "torchrun" or item.get_closest_marker("torchrun"):
            return None
        return self.pools.key(self.world_size_of(item), self.pg_timeout_of(self.timeout_of(item)))

    def starts_pools(self) -> bool:
        """Will this session run tests on rank pools (not --collect-only, --help, ..., torchrun
        mode, a runner without devices)? Only then are pools launched ahead of their tests."""
        option = self.config.option
        return not (self.mode != "pool" or self.runner_problem() is not None
                    or any(getattr(option, name, False) for name in ("help", "collectonly", "showfixtures",
                                                                      "show_fixtures_per_test", "markers")))

    def prestart(self) -> None:
        """Launches the pool most sessions run their first test on (the default world size and
        timeout) while pytest is still starting (Pools.launch_ahead)."""
        if self.starts_pools():
            self.pools.launch_ahead(self.default_world_size, self.default_pg_timeout())

    def warm_pools(self, items: list[pytest.Item]) -> None:
        """Once the selection is known: each pool's test modules, in run order (with Dynamo and
        inductor first where a test is marked `compiles`), for it to import before it forks;
        the pools not launched yet start now where they fit (Pools.warm). Tests that will skip
        (a skip marker, or skip_reason: another accelerator, fewer devices) need no pool."""
        if not self.starts_pools():
            return
        modules: dict[tuple[int, float | None], list[str]] = {}
        first_pg_timeout: dict[tuple[int, float | None], float] = {}
        for item in items:
            key = self.pool_key(item)
            if (key is None or not isinstance(item, pytest.Function) or item.get_closest_marker("skip")
                    or skip_reason(self, item)):
                continue
            names = modules.setdefault(key, [])
            first_pg_timeout.setdefault(key, self.pg_timeout_of(self.timeout_of(item)))
            ahead = [*COMPILER] if item.get_closest_marker("compiles") else []
            names.extend(name for name in [*ahead, item.module.__name__] if name not in names)
        self.pools.warm(modules, first_pg_timeout)

    def too_few_devices(self, world_size: int) -> bool:
        """Does this runner have fewer devices than `world_size` ranks need (never on CPU)?"""
        return self.device_type != "cpu" and 0 < self.device_count() < world_size

    def run_with_reruns(self, item: pytest.Function) -> Combined:
        """Run the test; a failure is run again (up to --distci-reruns times), the pool
        rebuilt first if the failure broke it. The earlier attempts travel with the last.

        A failure a known issue explains is not run again: a rerun tells a flake from a
        new failure, and a known one is judged by its entry either way (on the CPU nightly
        tier, rerunning the known failures was a quarter of a cell's time)."""
        attempts: list[tuple[str, str]] = []
        load: dict | None = None
        while True:
            combined = self.run(item, load_retry_factor(load) if load else 1.0)
            if combined.slowed_by_load and load is None:
                load = dict(combined.load or {})
                load["retried_with_s"] = round(self.timeout_of(item) * load_retry_factor(load), 1)
                attempts.append((combined.outcome, f"[{combined.failure_kind}] {combined.exc_type}: {combined.message} "
                                 f"(on a saturated runner: {describe_load(load)}; run again with "
                                 f"{load['retried_with_s']:.0f} s)"))
                continue
            if load is not None:
                combined.load = dict(load, then=combined.load)
            if (combined.outcome != "failed" or len(attempts) >= self.reruns + (load is not None)
                    or combined.known_issue(self.recorder.known_issues, item.nodeid, self.recorder.stack)):
                combined.attempts = attempts
                return combined
            attempts.append((combined.outcome, f"[{combined.failure_kind}] {combined.exc_type}: {combined.message}"))

    def run(self, item: pytest.Function, budget: float = 1.0) -> Combined:
        """One attempt; `budget` scales the test's timeout (its process-group class stays)."""
        world_size = self.world_size_of(item)
        timeout = self.timeout_of(item)
        request = self.request_for(item)
        problem = self.runner_problem()
        if problem:
            return Combined("error", "infra", "DeviceHealthError", problem, f"DeviceHealthError: {problem}")
        torchrun_marker = item.get_closest_marker("torchrun")
        if torchrun_marker or self.mode == "torchrun":
            self.start_reaper()
            combined = self.launcher(request, world_size, self.device_type, timeout * budget, self.log_dir,
                              owns_process_group=torchrun_marker is not None,
                              pg_timeout_s=self.pg_timeout_of(timeout), token=self.token)
        else:
            combined = self.pools.run(request, world_size, timeout * budget)
        if combined.outcome not in ("passed", "skipped"):
            self.keep_scratch = True
        return combined

    def close(self) -> None:
        self.pools.close(interrupted=self.recorder.interrupted)
        if self.reaper is not None:
            self.reaper.close()
            self.reaper = None
        run_cache = self.run_dir / "compile-cache"
        if Path(self.compile_cache.get(CACHE_ENV, "")) == run_cache:  # one run's own: nothing reuses it
            shutil.rmtree(run_cache, ignore_errors=True)
        if self.scratch and not self.keep_scratch and not self.recorder.interrupted:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        if self._run_dir_lock is not None:
            os.close(self._run_dir_lock)
            self._run_dir_lock = None


def scratch_dir(root: Path) -> Path:
    """A directory of this session's own under `root`/.distci/scratch (created when first used)."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    return root / ".distci" / "scratch" / f"{stamp}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def lock_run_dir(run_dir: Path) -> int:
    """Holds an exclusive lock on `run_dir` for this session (released when its fd closes,
    however the process ends): a second pytest given the same directory is refused rather
    than mixing its rank logs and results into this one's."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise pytest.UsageError(
            f"--distci-run-dir {run_dir} is in use by another pytest session; give each run its own "
            "directory (or leave the option out: every session then gets a scratch directory of its own)"
        ) from None
    return fd


__all__ = [
    "pytest_addoption", "pytest_configure", "pytest_sessionstart", "pytest_collection_finish",
    "pytest_unconfigure", "pytest_runtest_setup",
    "pytest_pyfunc_call", "dist", "Harness", "is_distributed", "skip_reason",
]
