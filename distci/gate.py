"""The release gate: may this tier (or this release candidate) ship?

The gate judges the latest run of every cell of a tier, or of every cell whose id
contains `--candidate` (a release candidate is a `test:<version>` Source of torch, so
its cells have their own ids and can be judged before the release ships). A test
blocks when its verdict is `regression` or `fail` in a release-blocking suite (declared
per tier in matrix.toml). `fixed` never blocks; `infra` and `flaky` never block but are
listed, because a cell that could not run is not a cell that passed.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from distci.errors import SelectionError
from distci.store import ResultRow, RunRow, Store, default_store_path, suite_of
from distci.verdicts import BLOCKING

WARN = ("infra", "flaky")
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


@dataclass
class GateItem:
    """One test the gate reports, with what a person needs to act on it."""

    cell_id: str
    run_id: str
    test_id: str
    suite: str
    verdict: str
    error_signature: str | None
    reason: str
    repro: str

    @classmethod
    def of(cls, r: ResultRow) -> "GateItem":
        return cls(r.cell_id, r.run_id, r.test_id, r.suite, r.verdict, r.error_signature, r.verdict_reason, r.repro)


@dataclass
class GateResult:
    tier: str
    candidate: str | None
    runs: list[RunRow]
    blocking_suites: list[str] | None
    blocking: list[GateItem] = field(default_factory=list)
    warnings: list[GateItem] = field(default_factory=list)
    not_blocking: list[GateItem] = field(default_factory=list)
    fixed: list[GateItem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.blocking

    def _scope(self) -> str:
        what = f"candidate `{self.candidate}`" if self.candidate else f"tier `{self.tier}`"
        if self.blocking_suites is None:
            suites = "all suites"
        else:
            suites = ", ".join(self.blocking_suites) or "none (nothing blocks this tier)"
        return f"{what}: {len(self.runs)} cells, blocking suites: {suites}"

    def to_text(self) -> str:
        lines = [f"gate {'PASSED' if self.ok else 'BLOCKED'} for {self._scope().replace('`', '')}"]
        for title, items in (
            ("blocking", self.blocking),
            ("warning (does not block)", self.warnings),
            ("failing outside release-blocking suites", self.not_blocking),
            ("fixed", self.fixed),
        ):
            for it in items:
                lines.append(f"  {title}: [{it.verdict}] {it.cell_id} :: {it.test_id}")
                if it.error_signature:
                    lines.append(f"      {it.error_signature}")
                if it.repro and it.verdict in BLOCKING:
                    lines.append(f"      repro: {it.repro}")
        return "\n".join(lines)

    def to_markdown(self) -> str:
        icon = ":white_check_mark:" if self.ok else ":x:"
        out = [f"## {icon} distci gate {'passed' if self.ok else 'blocked'}", "", self._scope(), ""]

        def table(title: str, items: list[GateItem]) -> None:
            if not items:
                return
            out.extend(
                [f"### {title} ({len(items)})", "", "| verdict | cell | test | error signature |", "|---|---|---|---|"]
            )
            for it in items:
                sig = (it.error_signature or it.reason or "").replace("|", "\\|")
                out.append(f"| {it.verdict} | `{it.cell_id}` | `{it.test_id}` | {sig} |")
            out.append("")

        table("Blocking", self.blocking)
        table("Warnings (do not block)", self.warnings)
        table("Failing outside release-blocking suites", self.not_blocking)
        table("Fixed", self.fixed)
        return "\n".join(out) + "\n"


def gate(
    store: Store, tier: str, candidate: str | None = None, blocking_suites: Iterable[str] | None = None
) -> GateResult:
    """Judges the latest run of each selected cell. `blocking_suites=None` means every
    suite blocks (the safe default when matrix.toml declares none)."""
    if candidate:
        latest = {c: r for c, r in store.latest_runs().items() if candidate in c}
        if not latest:
            raise SelectionError(
                f"--candidate {candidate!r} matches no cell in the store ({', '.join(store.cells()) or 'it is empty'})"
            )
    else:
        latest = store.latest_runs(tier=tier)
        if not latest:
            raise SelectionError(f"the store has no runs of tier {tier!r}; run the tier, then `nox -s ingest`")
    suites = sorted(set(blocking_suites)) if blocking_suites is not None else None
    out = GateResult(tier, candidate, list(latest.values()), suites)
    for run in out.runs:
        for r in store.results(run_id=run.run_id):
            if r.verdict in BLOCKING:
                blocks = suites is None or any(in_suite(r.test_id, s) for s in suites)
                (out.blocking if blocks else out.not_blocking).append(GateItem.of(r))
            elif r.verdict in WARN:
                out.warnings.append(GateItem.of(r))
            elif r.verdict == "fixed":
                out.fixed.append(GateItem.of(r))
    return out


def in_suite(test_id: str, suite: str) -> bool:
    """Whether a test belongs to a suite as matrix.toml names it: a path under the repo
    (`suites`, `suites/regressions`, a file), or a dashboard suite name (`tp`)."""
    path = test_id.split("::", 1)[0]
    prefix = suite.strip().rstrip("/")
    return path == prefix or path.startswith(prefix + "/") or suite_of(test_id) == prefix


def blocking_suites_from_matrix(tier: str, matrix_path: Path) -> list[str] | None:
    """`[tiers.<tier>] blocking_suites` of matrix.toml; None (every suite blocks) when
    there is no matrix file. An empty list means nothing blocks (e.g. nightly)."""
    if not Path(matrix_path).exists():
        return None
    from distci.matrix import load_matrix

    matrix = load_matrix(matrix_path)
    if tier not in matrix.tiers:
        raise SelectionError(f"tier {tier!r} is not declared; tiers: {', '.join(matrix.tiers)}", where=str(matrix_path))
    return list(matrix.tiers[tier].blocking_suites)


def write_step_summary(result: GateResult) -> Path | None:
    """Appends the Markdown summary to $GITHUB_STEP_SUMMARY when it is set."""
    target = os.environ.get(SUMMARY_ENV)
    if not target:
        return None
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(result.to_markdown())
    return Path(target)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers `gate` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "gate",
        help="exit non-zero when a release-blocking test regressed or fails",
        description="Judge the latest run of every cell of a tier (or of a release candidate) "
        "and list the blocking tests. fixed never blocks; infra and flaky are warnings.",
    )
    p.add_argument("--tier", default="release", help="tier whose cells are judged (default: release)")
    p.add_argument(
        "--candidate",
        default=None,
        help="judge the cells whose id contains this (a cell id or a Source, e.g. torch_test)",
    )
    p.add_argument(
        "--blocking-suite",
        action="append",
        dest="blocking_suites",
        default=None,
        help="a release-blocking suite (repeatable; default: tiers.<tier>.blocking_suites of matrix.toml, else all)",
    )
    p.add_argument(
        "--matrix", default=argparse.SUPPRESS, help="matrix file declaring blocking suites (default matrix.toml)"
    )
    p.add_argument(
        "--store", type=Path, default=None, help="store file (default $DISTCI_STORE or .distci/store.sqlite)"
    )
    p.set_defaults(fn=run)
    return p


def run(args: argparse.Namespace) -> int:
    suites = args.blocking_suites
    if suites is None:
        suites = blocking_suites_from_matrix(args.tier, Path(getattr(args, "matrix", "matrix.toml")))
    store_path = args.store or default_store_path()
    if not Path(store_path).exists():
        raise SelectionError(f"no store at {store_path}; run `nox -s ingest -- PATH...` first")
    with Store(store_path) as store:
        result = gate(store, args.tier, args.candidate, suites)
    print(result.to_text())
    write_step_summary(result)
    return 0 if result.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m distci.gate` is `python -m distci gate`."""
    from .cli import main_for

    return main_for("gate", argv)


if __name__ == "__main__":
    sys.exit(main())
