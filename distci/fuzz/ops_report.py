"""The ops fuzz run's markdown report: command, stack, cases, throughput, gaps and finds."""

from __future__ import annotations

from distci.stack import Stack


def render_report(report, cell_id: str, stack: Stack | None, started: str, command: str) -> str:
    """`report` is an ops_command.OpsReport."""
    lines = [f"# ops fuzz: {cell_id}, seed {report.seed}", "",
             f"- command: `{command}`" if command else "- command: (library call)",
             f"- started: {started}",
             f"- stack: torch {stack.torch or '?'} ({stack.torch_git or stack.get('git_version') or '?'}), "
             f"python {stack.python or '?'}, fixes {stack.fixes_mode or stack.fixes or '?'}" if stack else "- stack: ?",
             f"- cases: {report.cases} in {report.sweeps} sweep(s) ({report.sessions} pytest session(s)), {report.wall_s:.0f} s of sweeps: "
             f"**{report.per_hour():.0f} cases/hour** (shrinking included)",
             "- outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(report.counts.items())),
             "- slowest cases: " + (", ".join(f"`{i}` {s:.1f} s" for s, i in report.slowest) or "none"), ""]
    if report.gaps:
        lines += ["## Capability gaps (no sharding strategy registered, or the op refused its placements with "
                  "\"Please redistribute\": counted, not failures)", "",
                  "| op | cases |", "|---|---|"]
        lines += [f"| {op} | {n} |" for op, n in sorted(report.gaps.items())]
        lines.append("")
    lines += ["## Finds", ""]
    if not report.finds:
        lines += ["None.", ""]
    for i, f in enumerate(report.finds, 1):
        label = (f"known issue `{f.known_issue}`" if f.known_issue else
                 f"near miss of `{', '.join(f.near_miss)}`" if f.near_miss else
                 "did not fail again on its own" if f.outcome == "passed" else "**new**: to be triaged")
        lines += [f"### {i}. `{f.signature}` ({label})", "",
                  f"- drawn: `{f.found}`",
                  f"- shrunk: `{f.shrunk}` ({f.steps} step(s), {f.checks} check(s)"
                  + ("" if f.complete else ", stopped by its bound: may not be minimal") + ")",
                  f"- repeats: {report.repeats.get(f.signature, 0)} more case(s) with this signature",
                  f"- repro: `python -m distci run --cell {cell_id} --test '{f.test_id}'`", "", "```",
                  *f.message.splitlines()[:8], "```", ""]
    lines += ["## Cases per op", "", "| op | cases |", "|---|---|"]
    lines += [f"| {op} | {n} |" for op, n in sorted(report.by_op.items())]
    return "\n".join(lines) + "\n"
