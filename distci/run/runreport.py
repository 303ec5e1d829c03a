"""A Markdown report of run directories: the evidence files under reports/.

GPU runs happen on machines whose logs vanish; what is committed is this page: the
command, the stack (versions, git hash, devices), and every test's outcome and time.
Several run directories make one page when they are one cell's shards (`--shard K/N`) or
its resumed runs (`--resume`: each test counts once, with its latest answer).
With `--known-issues`, failures and passes are judged again by today's registry through
the matcher the harness and ingest use, so a page written after a registry change says
what the gate would say, not what was recorded at run time.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from distci.known_issues import Registry, load_registry, result_known_issue
from distci.rundir import RunContents, RunDirError, read_run
from distci.results import Result, has_answer
from distci.stack import Stack
from distci.run.resume import latest_results, public

STACK_KEYS = ("torch", "torch_git", "torchao", "torchtitan", "torch_npu", "python", "cuda", "nccl", "driver",
              "device_name", "device_count", "device_capability", "platform", "fixes_mode", "image_digest")


def _outcome(r: Any, known: str | None) -> str:
    """The page's word for a Result: `known` (a failure an entry explains), `fixed` (a pass
    inside an entry's scope: the entry may retire), `infra`, or the recorded outcome."""
    if not has_answer(r):
        return "infra"
    if known and r.outcome == "failed":
        return "known"
    if known and r.outcome == "passed":
        return "fixed"
    return r.outcome


def _stack_of(run: RunContents, results: Sequence[Result] | None = None) -> Stack:
    """The run's stack.json; when that is empty, the first result's stack."""
    results = run.results if results is None else results
    return run.stack if run.stack.to_dict() or not results else results[0].stack


def render(run_dirs: Path | Sequence[Path], *, title: str, command: str, notes: str = "",
           registry: Registry | None = None) -> str:
    dirs = [Path(run_dirs)] if isinstance(run_dirs, (str, Path)) else [Path(d) for d in run_dirs]
    runs = [read_run(d) for d in dirs]
    cells = sorted({run.info.cell_id for run in runs})
    if len(cells) > 1:
        raise RunDirError(f"one page is one cell's runs; these runs are of {len(cells)} cells: {', '.join(cells)}",
                          dirs[0])
    stacks = sorted({" ".join(f"{k} {public(_stack_of(run).get(k))}" for k in ("torch", "torchao", "torchtitan")
                              if _stack_of(run).get(k)) for run in runs})
    if len(stacks) > 1:  # an installed cell's id is the same on every interpreter
        raise RunDirError(f"one page is one stack's runs; these runs are of {len(stacks)}: {'; '.join(stacks)}", dirs[0])
    results, superseded = latest_results(runs)  # a resumed run's answer replaces the interrupted one
    stack = _stack_of(runs[0], results)
    lines = [f"# {title}", ""]
    if notes:
        lines += [notes, ""]
    lines += ["## Command", "", "```", command, "```", "", "## Stack", "", "| key | value |", "| --- | --- |"]
    lines += [f"| {k} | {stack.get(k)} |" for k in STACK_KEYS if stack.get(k) not in (None, "")]
    fixes = stack.fixes or []
    if fixes:
        lines += ["", "Fixes: " + ", ".join(f"{f.get('id')}={f.get('status')}" for f in fixes if isinstance(f, dict))]
    if len(runs) > 1:
        lines += ["", "## Runs", "", "| run | selection | started | ended | tests |", "| --- | --- | --- | --- | ---: |"]
        lines += [f"| {run.info.run_id} | {' '.join(run.info.selection)} | {run.info.started_at} | {run.info.ended_at} "
                  f"| {len(run.results)} |" for run in runs]
        if superseded:
            lines += ["", f"{superseded} result(s) left out: a later run answered the same test (a rerun, or `--resume`)."]
    known = {id(r): result_known_issue(r, registry) for r in results}
    words = {id(r): _outcome(r, known[id(r)]) for r in results}
    near = {id(r): registry.missed_by_stack(r.test_id, r.error_signature or "", r.message, r.stack)
            for r in results if registry is not None and words[id(r)] == "failed"}
    counts = Counter(words.values())
    total = sum(r.duration_s for r in results)
    lines += ["", "## Outcomes", "", ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + f"; {total:.0f} s in tests"]
    for word, heading in (("known", "Known issues matched"),
                          ("fixed", "Passes inside a known issue's scope (`fixed`, a warning)")):
        ids = Counter(known[id(r)] for r in results if words[id(r)] == word)
        if ids:
            lines += ["", f"{heading}: " + ", ".join(f"`{k}` {v}" for k, v in sorted(ids.items()))]
    missed = Counter(m for ms in near.values() for m in ms)
    if missed:
        lines += ["", "Failures an entry would explain but for where it applies (a range drawn too narrow? "
                  "widen it only on evidence): " + ", ".join(f"`{k}` {v}" for k, v in sorted(missed.items()))]
    lines += ["", "| test | outcome | kind | time (s) | detail |", "| --- | --- | --- | ---: | --- |"]
    for r in sorted(results, key=lambda r: r.test_id) if len(runs) > 1 else results:
        detail = (r.error_signature or (r.message if r.outcome in ("skipped", "error") or r.failure_kind == "infra"
                                        else "") or "").replace("|", "\\|").replace("\n", " ")[:160]
        if known[id(r)]:
            detail = f"known issue {known[id(r)]}: {detail}"
        elif near.get(id(r)):
            detail = f"near miss {'; '.join(near[id(r)])}: {detail}"
        lines.append(f"| `{r.test_id}` | {words[id(r)]} | {r.failure_kind or ''} | {r.duration_s:.1f} | {detail} |")
    return "\n".join(lines) + "\n"


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="render run directories (one cell's shards) as a Markdown evidence page")
    p.add_argument("run_dir", nargs="+")
    p.add_argument("--title", required=True)
    p.add_argument("--command", required=True, help="the command that produced the run")
    p.add_argument("--notes", default="")
    p.add_argument("--out", default="-")
    p.add_argument("--known-issues", default=None,
                   help="judge failures and passes again by this registry (e.g. suites/known_issues.toml)")
    p.set_defaults(fn=_run)


def _run(args: argparse.Namespace) -> int:
    registry = None
    if args.known_issues:
        registry = load_registry(Path(args.known_issues))  # a RegistryError is its own one line
    text = render([Path(d) for d in args.run_dir], title=args.title, command=args.command, notes=args.notes,
                  registry=registry)
    if args.out == "-":
        print(text, end="")
    else:
        Path(args.out).write_text(text)
    return 0
