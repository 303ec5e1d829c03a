"""The bisect report: the answer and every probe run, as JSON and as a few lines of text.

The JSON is what gets committed under reports/ and stored with a regression: it carries
each run's outcome, time and whether its environment was warm, so a second bisect over
the same candidates shows what the environment cache saves (cold vs warm), and the resume
command for an interrupted bisect.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from distci.bisect.engine import BisectResult, ProbeRecord, candidate_key

REPORT_VERSION = 1


def result_to_dict(result: BisectResult[Any], *, meta: dict[str, Any] | None = None,
                   resume: str | None = None, record: dict[str, Any] | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report of one bisect as JSON data.

    `record` (from store_record) goes in at the top level: the store reads those keys
    (distci.judge.store.read_bisect), so a report under .distci/bisect is a dashboard row.
    """
    key = _key_or_none
    names = ("last_good", "first_bad") if result.mode == "regression" else ("last_bad", "first_good")
    return {
        **(record or {}),
        "version": REPORT_VERSION,
        "kind": result.kind,
        "mode": result.mode,
        "reason": result.reason,
        "summary": summary(result),
        "how_sure": how_sure(result),
        "confirm": result.confirm,
        "came_and_went": None if result.flank is None else {
            "candidate": result.flank.key, "outcomes": result.flank.outcomes},
        names[0]: key(result.last_old),
        names[1]: key(result.first_new),
        "range": [candidate_key(c) for c in result.range],
        "skipped": [candidate_key(c) for c in result.skipped],
        "flaky": None if result.flaky is None else {
            "candidate": result.flaky.key, "outcomes": result.flaky.outcomes},
        "candidates": result.candidates,
        "repeats": result.repeats,
        "distinct_probes": len(result.probes),
        "probe_runs": sum(len(r.runs) for r in result.probes),
        "reasons": result.reasons,
        "timing": timing(result.probes),
        "probes": [_record(r) for r in result.probes],
        "meta": meta or {},
        "resume": resume,
        **(extra or {}),
    }


def store_record(result: BisectResult[Any], *, test_id: str | None, axis: str, cell_id: str = "",
                 report_path: str = "", culprit: str | None = None,
                 created_at: str = "") -> dict[str, Any] | None:
    """The keys distci.judge.store.read_bisect indexes, or None without a test id (a user's
    command is not a test of the matrix).

    `good` and `bad` are the two candidates around the change as the search left them
    (last good and first bad; for a fix, first good and last bad), the endpoints probed
    when there is no boundary (refused, flaky). `status` is the result's kind.
    """
    if not test_id:
        return None
    if result.last_old is not None and result.first_new is not None:
        good, bad = ((result.last_old, result.first_new) if result.mode == "regression"
                     else (result.first_new, result.last_old))
    else:
        ends = sorted(result.probes, key=lambda r: r.index)
        old, new = (ends[0].candidate, ends[-1].candidate) if ends else (None, None)
        good, bad = (old, new) if result.mode == "regression" else (new, old)
    return {"test_id": test_id, "axis": axis, "good": point(good), "bad": point(bad),
            "culprit": culprit, "cell_id": cell_id, "status": result.kind,
            "created_at": created_at, "report_path": report_path}


def point(candidate: Any) -> str:
    """A candidate as a short endpoint: a nightly date, a version, a 12-digit commit."""
    if candidate is None:
        return ""
    date = getattr(candidate, "date", None)
    if date is not None:
        return date.isoformat()
    version = getattr(candidate, "version", None)
    if isinstance(version, str):
        return version
    commit = getattr(candidate, "commit", None)
    if isinstance(commit, str):
        return commit[:12]
    return candidate_key(candidate)


def write_report(path: Path | str, result: BisectResult[Any], *,
                 meta: dict[str, Any] | None = None, resume: str | None = None,
                 record: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Write the JSON report atomically; returns its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = result_to_dict(result, meta=meta, resume=resume, record=record, extra=extra)
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


def timing(records: list[ProbeRecord[Any]]) -> dict[str, dict[str, float]]:
    """Probe runs and seconds by environment temperature: cold, warm, unknown, resumed.

    Resumed runs were timed in an earlier session; they are counted apart so a resumed
    bisect does not look faster than it was.
    """
    buckets: dict[str, dict[str, float]] = {}
    for record in records:
        for run in record.runs:
            name = ("resumed" if run.resumed else "unknown" if run.cached is None
                    else "warm" if run.cached else "cold")
            bucket = buckets.setdefault(name, {"runs": 0, "seconds": 0.0})
            bucket["runs"] += 1
            bucket["seconds"] = round(bucket["seconds"] + run.seconds, 3)
    for bucket in buckets.values():
        bucket["mean_seconds"] = round(bucket["seconds"] / bucket["runs"], 3)
    return buckets


def summary(result: BisectResult[Any]) -> str:
    """One line saying what was found."""
    new, old = ("first bad", "last good") if result.mode == "regression" else (
        "first good", "last bad")
    if result.kind == "boundary":
        return (f"{new}: {candidate_key(result.first_new)} "
                f"({old}: {candidate_key(result.last_old)})")
    if result.kind == "range":
        skipped = len(result.range) - 1
        return (f"RANGE, not a culprit: the change is one of {len(result.range)} candidates after "
                f"{candidate_key(result.last_old)} up to {candidate_key(result.first_new)}; "
                f"{skipped} could not be probed (skip or timeout)")
    if result.kind == "came-and-went":
        return (f"CAME AND WENT, no culprit named: {old} {candidate_key(result.last_old)}, {new} "
                f"{candidate_key(result.first_new)}, but {result.reason}")
    return f"{result.kind}: {result.reason}"


def how_sure(result: BisectResult[Any]) -> str:
    """What the answer rests on: the one-flip assumption, the confirmation, the flanks."""
    if result.kind not in ("boundary", "range", "came-and-went"):
        return ""
    around = [r.key for r in result.probes if r.phase == "flank"]
    confirmed = (f"{result.repeats + result.confirm} agreeing runs of each side of it"
                 f" ({result.confirm} fresh)" if result.confirm else
                 "NOT confirmed (--no-confirm): one run of each side")
    flanks = (f"; probed around it for a second flip: {', '.join(around)}" if around
              else "; nothing probed around it")
    return f"this search {result.assumption}; the answer has {confirmed}{flanks}"


def format_result(result: BisectResult[Any]) -> str:
    """The text the CLI prints at the end of a bisect."""
    lines = [summary(result)]
    if result.kind == "range":
        lines += [f"  {candidate_key(c)}" for c in result.range]
    if how_sure(result):
        lines.append(how_sure(result))
    runs = sum(len(r.runs) for r in result.probes)
    lines.append(f"{len(result.probes)} candidates probed of {result.candidates} "
                 f"({runs} runs, repeats={result.repeats})")
    for name, bucket in timing(result.probes).items():
        lines.append(f"  {name}: {bucket['runs']:g} runs, {bucket['seconds']:.1f}s "
                     f"(mean {bucket['mean_seconds']:.1f}s)")
    if result.reasons:
        lines.append("  " + ", ".join(f"{reason}: {count} runs" for reason, count in result.reasons.items())
                     + " (timeout: the check ran past --timeout; infra: the environment could not "
                     "be built, retried on the next run)")
    return "\n".join(lines)


def _record(record: ProbeRecord[Any]) -> dict[str, Any]:
    describe = getattr(record.candidate, "to_dict", None)
    return {
        "candidate": record.key,
        "index": record.index,
        "phase": record.phase,
        "outcome": record.outcome,
        "seconds": round(record.seconds, 3),
        "cached": record.cached,
        "resumed": record.resumed,
        "runs": [dict(run.to_dict(), resumed=run.resumed) for run in record.runs],
        "details": describe() if callable(describe) else None,
    }


def _key_or_none(candidate: Any) -> str | None:
    return None if candidate is None else candidate_key(candidate)


def to_markdown(data: dict[str, Any], *, command: str | None = None) -> str:
    """A report (result_to_dict's data) as Markdown, for committing under reports/:
    the command, the answer, every probe with its outcome and time, cold vs warm."""
    lines = []
    if command:
        lines += ["```", command, "```", ""]
    lines += [f"**Result** ({data['kind']}, {data['mode']}): {data['summary']}", ""]
    if data.get("how_sure"):
        lines += [data["how_sure"], ""]
    commits = data.get("commits")
    if commits:
        lines += [f"- last {'good' if data['mode'] == 'regression' else 'bad'}: "
                  f"`{commits['last_old']}`",
                  f"- first {'bad' if data['mode'] == 'regression' else 'good'}: "
                  f"`{commits['first_new']}`",
                  f"- compare: {commits.get('compare') or _compare(commits)}", ""]
    lines += ["| step | phase | candidate | outcome | seconds | setup s | env |",
              "|---:|---|---|---|---:|---:|---|"]
    for step, probe in enumerate(data["probes"], 1):
        run = probe["runs"][0] if probe["runs"] else {}
        env = ("resumed" if probe["resumed"] else "?" if probe["cached"] is None
               else "warm" if probe["cached"] else "cold")
        setup = run.get("setup_seconds")
        lines.append(f"| {step} | {probe['phase']} | {_label(probe)} | {probe['outcome']} | "
                     f"{probe['seconds']:.1f} | {'' if setup is None else f'{setup:.1f}'} | {env} |")
    lines.append("")
    for reason, count in (data.get("reasons") or {}).items():
        lines.append(f"- {reason}: {count} runs")
    for name, bucket in data["timing"].items():
        lines.append(f"- {name}: {bucket['runs']:g} runs, {bucket['seconds']:.1f} s "
                     f"(mean {bucket['mean_seconds']:.1f} s)")
    return "\n".join(lines) + "\n"


def _compare(commits: dict[str, Any]) -> str:
    """The compare URL of a report written before `commits` carried one."""
    from distci.bisect.upstream import COMPARE_URL

    return COMPARE_URL.format(repo="pytorch/pytorch", good=commits["last_old"], bad=commits["first_new"])


def _label(probe: dict[str, Any]) -> str:
    details = probe.get("details") or {}
    if details.get("subject"):
        return f"`{probe['candidate'][:12]}` {details['subject'].replace('|', '/')}"
    return f"`{probe['candidate']}`"
