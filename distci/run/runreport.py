"""A Markdown report of one run directory: the evidence files under reports/.

GPU runs happen on machines whose logs vanish; what is committed is this page: the
command, the stack (versions, git hash, devices), and every test's outcome and time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from distci.rundir import STACK_FILE, read_results

STACK_KEYS = ("torch", "torch_git", "torchao", "torchtitan", "torch_npu", "python", "cuda", "nccl", "driver",
              "device_name", "device_count", "device_capability", "platform", "fixes_mode", "image_digest")


def render(run_dir: Path, *, title: str, command: str, notes: str = "") -> str:
    results = list(read_results(run_dir))
    stack_path = run_dir / STACK_FILE
    stack = json.loads(stack_path.read_text()) if stack_path.exists() else (results[0].stack if results else {})
    lines = [f"# {title}", ""]
    if notes:
        lines += [notes, ""]
    lines += ["## Command", "", "```", command, "```", "", "## Stack", "", "| key | value |", "| --- | --- |"]
    lines += [f"| {k} | {stack.get(k)} |" for k in STACK_KEYS if stack.get(k) not in (None, "")]
    fixes = stack.get("fixes") or []
    if fixes:
        lines += ["", "Fixes: " + ", ".join(f"{f.get('id')}={f.get('status')}" for f in fixes if isinstance(f, dict))]
    counts: dict[str, int] = {}
    for r in results:
        key = "xfail" if r.known_issue and r.outcome == "failed" else r.outcome
        counts[key] = counts.get(key, 0) + 1
    total = sum(r.duration_s for r in results)
    lines += ["", "## Outcomes", "", ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f"; {total:.0f} s in tests",
              "", "| test | outcome | kind | time (s) | detail |", "| --- | --- | --- | ---: | --- |"]
    for r in results:
        detail = (r.error_signature or (r.message if r.outcome == "skipped" else "") or "").replace("|", "\\|")[:160]
        if r.known_issue:
            detail = f"known issue {r.known_issue}: {detail}"
        lines.append(f"| `{r.test_id}` | {r.outcome} | {r.failure_kind or ''} | {r.duration_s:.1f} | {detail} |")
    return "\n".join(lines) + "\n"


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="render a run directory as a Markdown evidence page")
    p.add_argument("run_dir")
    p.add_argument("--title", required=True)
    p.add_argument("--command", required=True, help="the command that produced the run")
    p.add_argument("--notes", default="")
    p.add_argument("--out", default="-")
    p.set_defaults(fn=_run)


def _run(args: argparse.Namespace) -> int:
    text = render(Path(args.run_dir), title=args.title, command=args.command, notes=args.notes)
    if args.out == "-":
        print(text, end="")
    else:
        Path(args.out).write_text(text)
    return 0
