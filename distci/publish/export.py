"""Export results for PyTorch HUD's Cross-Repository CI Relay (CRCR).

An out-of-tree backend team reports upstream through the relay (pytorch/rfcs RFC-0050,
HUD side RFC-0054): a GitHub job calls pytorch/test-infra's
`.github/actions/cross-repo-ci-relay-callback` action once per job, and the HUD's OOT
pages key the result by the upstream pytorch/pytorch commit it tested. For scheduled
runs (ours) the action takes `delivery-id` = the upstream commit SHA and `event-type` =
`nightly` or `periodic`, plus `conclusion` (a GitHub check conclusion), `job-name`
(unique per matrix leg: we use the cell id), `test-results` (a summary of counts, not
an enumeration), `failed-tests-detail` (name, classname, message, stacktrace, duration;
at most 1000 entries, message 1 KB, stacktrace 4 KB) and `triage-verdict` (schema 1:
`category` upstream | backend | infra | flake | unknown, `confidence` high | medium | low,
`summary`, optional `suspected_upstream` for upstream only, `evidence`,
`reproduced_on_retry`, `analyzer`, `analyzed_at`).

So `export --hud` writes one row per (upstream SHA, cell run) whose keys are exactly those
action inputs (snake_case), ready for a workflow matrix that calls the action per row,
plus a `distci` block with the run's provenance. The triage category is our verdict
mapped onto the relay's words:

- `upstream`: a regression whose previous green run had a different torch commit (the
  upstream change under test broke it), or a `fail` that such a regression started
  (followed back through the runs it was compared with);
- `backend`: a regression with the same torch commit (our side changed: torchao,
  torchtitan, fixes, image);
- `unknown`: failing with no green history to compare with;
- `infra`: the environment, image or device failed (conclusion `neutral`: rule 4, never red);
- `flake`: mixed outcomes in one environment (conclusion stays `success`).

A SHA's verdict is the most serious category of its rows, in that order, else `pass`.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from distci import __version__
from distci.errors import SelectionError
from distci.judge.coverage import tally
from distci.judge.store import Store, default_store_path
from distci.judge.rows import ResultRow, RunRow
from distci.judge.verdicts import BLOCKING, ENV_KEYS
from distci.stack import Stack

UPSTREAM_REPO = "pytorch/pytorch"
CATEGORIES = ("upstream", "backend", "unknown", "infra", "flake")
MAX_DETAILS = 1000
MESSAGE_BYTES = 1024
STACKTRACE_BYTES = 4096
MAX_EVIDENCE = 10
DEFAULT_OUT = Path(".distci") / "export" / "hud.jsonl"


def _cap(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    return text if len(data) <= limit else data[: limit - 3].decode("utf-8", "ignore") + "..."


@dataclass
class HudRow:
    """One relay callback: the inputs of cross-repo-ci-relay-callback for one cell run."""

    delivery_id: str
    event_type: str
    job_name: str
    conclusion: str
    test_results: dict[str, Any]
    failed_tests_detail: list[dict[str, Any]]
    triage_verdict: dict[str, Any] | None
    distci: dict[str, Any] = field(default_factory=dict)
    artifact_url: str = ""
    status: str = "completed"
    upstream_repo: str = UPSTREAM_REPO
    schema_version: int = 1

    @property
    def category(self) -> str | None:
        return self.triage_verdict["category"] if self.triage_verdict else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _detail(r: ResultRow) -> dict[str, Any]:
    classname, _, name = r.test_id.rpartition("::")
    return {
        "name": name or r.test_id,
        "classname": classname,
        "message": _cap(r.error_signature or r.excerpt.split("\n", 1)[0], MESSAGE_BYTES),
        "stacktrace": _cap(r.excerpt, STACKTRACE_BYTES),
        "duration": round(r.duration_s, 3),
    }


def _env_differs_only_in_torch(a: Stack, b: Stack) -> bool:
    keys = [k for k in ENV_KEYS if k not in ("torch", "torch_git")]
    return all(a.get(k) == b.get(k) for k in keys)


def _cause(store: Store, r: ResultRow) -> tuple[str, RunRow | None, RunRow | None]:
    """Where a failure came from: (upstream | backend | unknown, last green run, first red run).

    A `fail` is followed back through the runs it was compared with to the regression
    that started it; that regression is upstream when torch's commit changed between the
    green run and the red one.
    """
    cur: ResultRow | None = r
    for _ in range(10_000):
        if cur is None or cur.verdict != "fail" or not cur.compared_run:
            break
        cur = store.result(cur.compared_run, cur.test_id)
    if cur is None or cur.verdict != "regression" or not cur.compared_run:
        return "unknown", None, None
    green, red = store.run(cur.compared_run), store.run(cur.run_id)
    if green and red and green.torch_git and green.torch_git != red.torch_git:
        return "upstream", green, red
    return "backend", green, red


def _sha(run: RunRow | None) -> str:
    return f"{UPSTREAM_REPO}@{((run.torch_git if run else None) or '?')[:12]}"


def _triage(store: Store, run: RunRow, results: list[ResultRow]) -> dict[str, Any] | None:
    failing = [r for r in results if r.verdict in BLOCKING]
    causes = {r.test_id: _cause(store, r) for r in failing}
    groups = {c: [r for r in failing if causes[r.test_id][0] == c] for c in ("upstream", "backend", "unknown")}
    infra = [r for r in results if r.verdict == "infra"]
    flaky = [r for r in results if r.verdict == "flaky"]
    suspected = None
    if groups["upstream"]:
        evidence_rows = groups["upstream"]
        new = [r for r in evidence_rows if r.verdict == "regression"]
        first = (new or evidence_rows)[0]
        _, green, red = causes[first.test_id]
        category = "upstream"
        confidence = "high" if new and green and _env_differs_only_in_torch(green.stack, run.stack) else "medium"
        what = first.error_signature or first.verdict_reason
        if new:
            head = f"{len(new)} test(s) regressed between {_sha(green)} and {_sha(run)}"
        else:
            head = f"{len(evidence_rows)} test(s) failing since {_sha(red)} (green at {_sha(green)})"
        summary = f"{head}; first: {first.test_id}: {what}"
        culprits = [b for b in store.bisects() if b.test_id == first.test_id and b.culprit]
        if culprits:
            b = culprits[0]
            suspected = {"commit": b.culprit, "reason": f"bisect over {b.axis}: first bad {b.bad}"}
    elif groups["backend"]:
        evidence_rows = groups["backend"]
        category, confidence = "backend", "medium"
        first = evidence_rows[0]
        summary = (
            f"{len(evidence_rows)} test(s) regressed with torch unchanged (torchao, torchtitan, fixes or image "
            f"changed); first: {first.test_id}: {first.error_signature or first.verdict_reason}"
        )
    elif groups["unknown"]:
        evidence_rows = groups["unknown"]
        category, confidence = "unknown", "low"
        first = evidence_rows[0]
        summary = f"{len(evidence_rows)} test(s) failing with no green history; first: {first.test_id}"
    elif infra:
        evidence_rows = infra
        category, confidence = "infra", "high"
        summary = f"environment, image or device failure: {infra[0].error_signature or infra[0].excerpt[:200]}"
    elif flaky:
        evidence_rows = flaky
        category, confidence = "flake", "medium"
        summary = f"{len(flaky)} test(s) gave mixed outcomes in one environment; first: {flaky[0].test_id}"
    else:
        category = None
    if category is None:
        return None
    verdict: dict[str, Any] = {
        "schema_version": 1,
        "category": category,
        "confidence": confidence,
        "summary": _cap(summary, 1024),
        "evidence": [
            {"job": run.cell_id, "test": r.test_id, "excerpt": _cap(r.error_signature or r.excerpt, 1024)}
            for r in evidence_rows[:MAX_EVIDENCE]
        ],
        "analyzer": {"name": "distci", "version": __version__},
        "analyzed_at": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
    }
    retried = [r for r in evidence_rows if r.rerun_outcomes]
    if retried and category in ("upstream", "backend", "unknown"):
        verdict["reproduced_on_retry"] = all(all(o != "passed" for o in r.rerun_outcomes) for r in retried)
    elif category == "flake":
        verdict["reproduced_on_retry"] = False
    if suspected:
        verdict["suspected_upstream"] = suspected
    return verdict


# Tiers whose runs are scheduled (cron): HUD lists `nightly` rows on its nightly page, and
# a release-tier run is a scheduled run of the same workflow, so it is `nightly` too.
SCHEDULED_TIERS = ("nightly", "release")


def event_type(run: RunRow) -> str:
    return "nightly" if run.tier in SCHEDULED_TIERS or run.nightly_date else "periodic"


def hud_row(store: Store, run: RunRow, *, artifact_url: str = "") -> HudRow | None:
    """The relay row of one run, or None when the run has no upstream SHA to key it by.

    The conclusion follows the gate's words: a blocking verdict is `failure`; a known
    issue (xfail) or a flaky test does not block; a run with infra results and nothing
    blocking is `neutral` (the gate calls it INCOMPLETE, never PASSED), and so is a run
    narrowed by `-k` / `--test` with nothing blocking (it covers part of the cell). Counts are the
    gate's (`distci.judge.coverage.tally`): a known issue is `known`, never `failed`. A run that never
    ended (no `ended_at`: still going, or its runner died before it could say) is
    `in_progress` with no conclusion: only an ended run is `completed`.
    """
    if not run.torch_git:
        return None
    results = store.results(run_id=run.run_id)
    verdicts = Counter(r.verdict for r in results)
    if not run.ended_at:
        conclusion = ""
    elif any(v in BLOCKING for v in verdicts):
        conclusion = "failure"
    elif verdicts.get("infra") or run.selection:
        conclusion = "neutral"  # a narrowed rerun (-k / --test) never says a whole cell passed
    else:
        conclusion = "success"
    return HudRow(
        delivery_id=run.torch_git,
        event_type=event_type(run),
        job_name=run.cell_id,
        conclusion=conclusion,
        status="completed" if run.ended_at else "in_progress",
        test_results={**tally(results), "verdicts": dict(sorted(verdicts.items()))},
        failed_tests_detail=[_detail(r) for r in results
                             if r.outcome in ("failed", "error") and r.verdict != "xfail"][:MAX_DETAILS],
        triage_verdict=_triage(store, run, results),
        artifact_url=artifact_url,
        distci={
            "run_id": run.run_id,
            "cell_id": run.cell_id,
            "tier": run.tier,
            "nightly_date": run.nightly_date,
            "started_at": run.started_at,
            "ended_at": run.ended_at,
            "runner": run.runner,
            "selection": list(run.selection or []),
            "stack": {k: run.stack.get(k) for k in ENV_KEYS if run.stack.get(k) is not None},
        },
    )


def hud_rows(
    store: Store, since: str | None = None, cell: str | None = None, left_out: list[str] | None = None,
    artifact_url: str = "",
) -> list[HudRow]:
    """Rows for every run (started on or after `since`, of cells whose id matches `cell`: a cell id, shell globs allowed, as --cell means everywhere).

    Runs without a torch commit (their environment never came up far enough to import
    torch) cannot be keyed by an upstream SHA; their ids go to `left_out`.
    """
    rows = []
    for run in store.runs():
        if since and run.started_at[:10] < since:
            continue
        if cell and not fnmatch.fnmatchcase(run.cell_id, cell):
            continue
        row = hud_row(store, run, artifact_url=artifact_url)
        if row is not None:
            rows.append(row)
        elif left_out is not None:
            left_out.append(run.run_id)
    return rows


def sha_verdicts(rows: Iterable[HudRow]) -> dict[str, str]:
    """One word per upstream SHA: the most serious category of its rows, else `pass`."""
    out: dict[str, str] = {}
    for row in rows:
        cur = out.get(row.delivery_id, "pass")
        cat = row.category or "pass"
        rank = {c: i for i, c in enumerate((*CATEGORIES, "pass"))}
        out[row.delivery_id] = cat if rank[cat] < rank[cur] else cur
    return out


def write_rows(rows: Sequence[HudRow], out: Path, fmt: str = "jsonl") -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    dicts = [r.to_dict() for r in rows]
    if fmt == "json":
        out.write_text(json.dumps(dicts, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    else:
        out.write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in dicts), encoding="utf-8")
    return out


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Registers `export` on an argparse subparsers object."""
    p = subparsers.add_parser(
        "export",
        help="export results for other systems (--hud: PyTorch HUD's cross-repo CI relay)",
        description="Write one row per (upstream torch SHA, cell run) with the inputs of "
        "pytorch/test-infra's cross-repo-ci-relay-callback action.",
    )
    p.add_argument("--hud", action="store_true", required=True, help="rows for PyTorch HUD's cross-repo CI relay")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output file (default {DEFAULT_OUT}; - for stdout)")
    p.add_argument(
        "--format", choices=("jsonl", "json"), default="jsonl", help="JSON lines, or one array (for a workflow matrix)"
    )
    p.add_argument("--since", default=None, help="only runs started on or after this date (YYYY-MM-DD)")
    p.add_argument("--cell", default=None, help="only this cell (a cell id; shell globs select several)")
    p.add_argument(
        "--store", type=Path, default=None, help="store file (default $DISTCI_STORE or .distci/store.sqlite)"
    )
    p.add_argument("--artifact-url", default=None,
                   help="URL of the run's logs and reports (default: this Actions run's page, when in Actions)")
    p.add_argument("--github-output", action="store_true",
                   help="write the newest row of --cell as the relay action's inputs to $GITHUB_OUTPUT "
                        "(post=false when there is none)")
    p.set_defaults(fn=run)
    return p


def action_inputs(row: HudRow | None) -> dict[str, str]:
    """One row as cross-repo-ci-relay-callback's inputs (JSON values on one line each)."""
    if row is None:
        return {"post": "false"}
    compact = {"separators": (",", ":"), "sort_keys": True}
    return {
        "post": "true", "status": row.status, "conclusion": row.conclusion, "delivery-id": row.delivery_id,
        "event-type": row.event_type, "job-name": row.job_name, "artifact-url": row.artifact_url,
        "test-results": json.dumps(row.test_results, **compact),
        "failed-tests-detail": json.dumps(row.failed_tests_detail, **compact),
        "triage-verdict": json.dumps(row.triage_verdict, **compact) if row.triage_verdict else "",
    }


def run(args: argparse.Namespace) -> int:
    from distci.ci.actions import workflow_run_url, write_outputs

    store_path = args.store or default_store_path()
    if not Path(store_path).exists():
        raise SelectionError(f"no store at {store_path}; run `nox -s ingest -- PATH...` first")
    left_out: list[str] = []
    with Store(store_path, reading=True) as store:
        rows = hud_rows(store, since=args.since, cell=args.cell, left_out=left_out,
                        artifact_url=args.artifact_url or workflow_run_url())
    if args.github_output:
        if not args.cell:
            raise SelectionError("--github-output writes one row: give its --cell")
        mine = sorted((r for r in rows if r.job_name == args.cell), key=lambda r: r.distci.get("started_at") or "")
        print(write_outputs(action_inputs(mine[-1] if mine else None)), end="")
        return 0
    if left_out:
        print(f"left out {len(left_out)} runs without a torch commit: {', '.join(left_out)}", file=sys.stderr)
    if str(args.out) == "-":
        for r in rows:
            print(json.dumps(r.to_dict(), sort_keys=True))
        return 0
    write_rows(rows, args.out, args.format)
    for sha, verdict in sha_verdicts(rows).items():
        print(f"{sha[:12]}  {verdict}")
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m distci.publish.export` is `python -m distci export`."""
    from distci.command import run_module

    return run_module(add_parser, argv)


if __name__ == "__main__":
    sys.exit(main())
