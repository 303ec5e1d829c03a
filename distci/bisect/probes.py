"""Probes: one candidate -> good | bad | skip, by installing it (install.py) and running
the check (checks.py).

An environment that cannot be built answers skip with reason `infra` (DESIGN rule 4:
infra is not a regression); the engine never replays an infra skip from a saved state,
so fixing the build and rerunning probes the candidate again. A check that times out
answers what the check's `on_timeout` says, with reason `timeout`.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable, Sequence

from distci.bisect.candidates import CommitCandidate, WheelCandidate
from distci.bisect.checks import CommandCheck, tail
from distci.bisect.engine import ProbeOutcome
from distci.bisect.install import CommitBuilder, EnvCache, InstallFailed, site_packages
from distci.bisect.overlay import OverlayPlan, lay_python_over


class WheelProbe:
    """Installs a release / nightly / wheelhouse candidate, then runs the check: in the env
    of its stack (the candidate with the pins), or laid over --base-env."""

    def __init__(self, check: CommandCheck, cache: EnvCache) -> None:
        self.check = check
        self.cache = cache

    def __call__(self, candidate: WheelCandidate) -> ProbeOutcome:
        if self.cache.base.env is None:  # a stack: the env distci.provision.envs makes for it
            return run_probe(self.check, lambda: self.cache.stack(candidate))
        return run_probe(self.check, lambda: self.cache.ensure(
            candidate.key, lambda: self.cache.wheel_install(candidate)))


class CommitProbe:
    """Installs a pure-Python package at one commit of a local clone (built by `builder`,
    see install.CommitBuilder), without dependencies: those come from the base env."""

    def __init__(self, check: CommandCheck, cache: EnvCache, builder: CommitBuilder) -> None:
        self.check = check
        self.cache = cache
        self.builder = builder

    def __call__(self, candidate: CommitCandidate) -> ProbeOutcome:
        return run_probe(self.check, lambda: self.cache.ensure(
            f"{candidate.commit}-{self.builder.key()}",
            lambda: ["--no-deps", "--no-index", str(self.builder.wheel(candidate))]))


class OverlayProbe:
    """Probes a PyTorch main commit as the good or bad nightly's binary with the commit's
    shipped Python laid over it (see overlay.py); commits no binary matches are skipped.

    `good` and `bad` are (main commit the nightly was built from, venv holding that
    nightly), e.g. from EnvCache.ensure of the two nightly candidates. The commit's venv
    is a hard-linked copy of the nightly's site-packages, so it costs little disk. Checks
    should run ``python -m torch.distributed.run``, not the nightly venv's scripts.
    """

    def __init__(self, check: CommandCheck, cache: EnvCache, repo: Path | str, *,
                 good: tuple[str, Path], bad: tuple[str, Path],
                 plans: Sequence[OverlayPlan]) -> None:
        self.check = check
        self.cache = cache
        self.repo = Path(repo)
        self.binaries = {"good": good, "bad": bad}
        self.plans = {plan.commit: plan for plan in plans}

    def __call__(self, candidate: CommitCandidate) -> ProbeOutcome:
        plan = self.plans[candidate.commit]
        if plan.binary is None:
            return ProbeOutcome("skip", detail=plan.reason, reason="native")
        base_commit, base_env = self.binaries[plan.binary]

        def populate(venv: Path) -> None:
            try:
                lay_python_over(self.repo, base_commit, candidate.commit,
                                site_packages(base_env), site_packages(venv))
            except (OSError, subprocess.CalledProcessError) as exc:
                raise InstallFailed(f"overlay failed: {exc}") from exc

        return run_probe(self.check, lambda: self.cache.ensure(
            f"overlay-{plan.binary}-{candidate.commit}", populate=populate),
            note=f"{plan.binary} nightly's binary: {plan.reason}\n")


def run_probe(check: CommandCheck, setup: Callable[[], tuple[Path, bool]],
              note: str = "") -> ProbeOutcome:
    """Set up (venv, warm) and run the check there; a failed setup is an infra skip."""
    started = time.monotonic()
    try:
        venv, warm = setup()
    except InstallFailed as failed:
        return ProbeOutcome("skip", cached=False, detail=f"{failed}\n{tail(failed.log)}",
                            setup_seconds=round(time.monotonic() - started, 3), reason="infra")
    setup_seconds = round(time.monotonic() - started, 3)
    outcome, reason, detail = check.run(venv)
    return ProbeOutcome(outcome, cached=warm, detail=note + detail,  # type: ignore[arg-type]
                        setup_seconds=setup_seconds, reason=reason)
