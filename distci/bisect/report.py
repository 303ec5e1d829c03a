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
                   resume: str | None = None) -> dict[str, Any]:
    """The report of one bisect as JSON data."""
    key = _key_or_none
    names = ("last_good", "first_bad") if result.mode == "regression" else ("last_bad", "first_good")
    return {
        "version": REPORT_VERSION,
        "kind": result.kind,
        "mode": result.mode,
        "reason": result.reason,
        "summary": summary(result),
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
        "timing": timing(result.probes),
        "probes": [_record(r) for r in result.probes],
        "meta": meta or {},
        "resume": resume,
    }


def write_report(path: Path | str, result: BisectResult[Any], *,
                 meta: dict[str, Any] | None = None, resume: str | None = None) -> Path:
    """Write the JSON report atomically; returns its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result_to_dict(result, meta=meta, resume=resume), indent=1) + "\n")
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
        return (f"the change is in {len(result.range)} candidates after "
                f"{candidate_key(result.last_old)} up to {candidate_key(result.first_new)}; "
                f"{skipped} could not be probed (skip)")
    return f"{result.kind}: {result.reason}"


def format_result(result: BisectResult[Any]) -> str:
    """The text the CLI prints at the end of a bisect."""
    lines = [summary(result)]
    if result.kind == "range":
        lines += [f"  {candidate_key(c)}" for c in result.range]
    runs = sum(len(r.runs) for r in result.probes)
    lines.append(f"{len(result.probes)} candidates probed of {result.candidates} "
                 f"({runs} runs, repeats={result.repeats})")
    for name, bucket in timing(result.probes).items():
        lines.append(f"  {name}: {bucket['runs']:g} runs, {bucket['seconds']:.1f}s "
                     f"(mean {bucket['mean_seconds']:.1f}s)")
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
