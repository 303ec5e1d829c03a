"""Regression issues: one per error signature, one comment per batch of new occurrences.

An issue is found again by the signature marker in its body, so the same bug in six
cells or on three nights is one issue; every occurrence (run, test) is recorded once by
its own marker, so aggregating the same artifacts twice posts nothing twice. Bisects
are dispatched from here too (workflow_dispatch of bisect.yml), marked the same way.
In a dry run the Tracker logs what it would write and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from distci.provision.github import GitHub
from distci.ci.ids import marker, markers
from distci.ci.regressions import BisectPlan, bisect_plan, issue_key, occurrence_key, stack_changes
from distci.judge.rows import Regression

Log = Callable[[str], None]

ISSUE_LABEL = "distci-regression"
LABEL_COLOR = "b60205"
BISECT_WORKFLOW = "bisect.yml"
MAX_BODY = 60_000
EXCERPT_LINES = 60


@dataclass
class Issue:
    number: int
    state: str
    title: str
    html_url: str
    markers: set[str]


class Tracker:
    """Issues and dispatches through GitHub, or, in a dry run, the plan of them.

    In a dry run nothing is written; reads still happen when a token is configured (so
    the plan says `comment on #12` rather than `open`), and without one every regression
    is planned as a new issue.
    """

    def __init__(self, github: GitHub | None, *, dry_run: bool, log: Log = print) -> None:
        self.gh = github
        self.dry_run = dry_run
        self.log = log
        self._planned = 0

    def _act(self, action: str, **details: Any) -> None:
        verb = "would " if self.dry_run else ""
        text = ", ".join(f"{k}={v}" for k, v in details.items() if k not in ("body",))
        self.log(f"aggregate: {verb}{action}: {text}")

    def ensure_label(self) -> None:
        if self.gh is None or self.dry_run:
            return
        status, _, _ = self.gh.request("GET", f"/labels/{ISSUE_LABEL}", allow=(404,))
        if status == 404:
            self.gh.request("POST", "/labels", {"name": ISSUE_LABEL, "color": LABEL_COLOR,
                                                "description": "a test that passed and now fails (filed by distci)"},
                            allow=(422,))

    def issues_by_signature(self) -> dict[str, Issue]:
        """Existing distci issues (open first, then the newest closed) by signature key."""
        if self.gh is None:
            return {}
        found: dict[str, Issue] = {}
        for raw in self.gh.paginate("/issues", {"labels": ISSUE_LABEL, "state": "all"}):
            if "pull_request" in raw:
                continue
            issue = Issue(raw["number"], raw["state"], raw.get("title", ""), raw.get("html_url", ""),
                          markers(raw.get("body") or ""))
            for mark in issue.markers:
                kind, _, key = mark.partition("=")
                if kind != "signature":
                    continue
                old = found.get(key)
                if old is None or (old.state != "open", -old.number) > (issue.state != "open", -issue.number):
                    found[key] = issue
        return found

    def load_comment_markers(self, issue: Issue) -> None:
        if self.gh is None or issue.number < 0:
            return
        for comment in self.gh.paginate(f"/issues/{issue.number}/comments"):
            issue.markers |= markers(comment.get("body") or "")

    def open_issue(self, title: str, body: str) -> Issue:
        self._act("open issue", title=title, body=body)
        if self.gh is None or self.dry_run:
            self._planned += 1
            return Issue(-self._planned, "open", title, "", markers(body))  # numbers below 0: not filed
        _, data, _ = self.gh.request("POST", "/issues", {"title": title, "body": body, "labels": [ISSUE_LABEL]})
        return Issue(data["number"], data["state"], title, data.get("html_url", ""), markers(body))

    def comment(self, issue: Issue, body: str, *, reopen: bool = False) -> None:
        if reopen and issue.state != "open":
            self._act("reopen issue", issue=issue.number)
            if self.gh is not None and not self.dry_run:
                self.gh.request("PATCH", f"/issues/{issue.number}", {"state": "open"})
            issue.state = "open"
        self._act("comment", issue=issue.number, body=body)
        if self.gh is not None and not self.dry_run and issue.number > 0:
            self.gh.request("POST", f"/issues/{issue.number}/comments", {"body": body})
        issue.markers |= markers(body)

    def dispatch(self, workflow: str, ref: str, inputs: dict[str, str]) -> None:
        self._act("dispatch", workflow=workflow, ref=ref, **inputs)
        if self.gh is not None and not self.dry_run:
            self.gh.request("POST", f"/actions/workflows/{workflow}/dispatches", {"ref": ref, "inputs": inputs})



def code(text: str) -> str:
    return "`" + str(text).replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"


def _occurrence_table(items: Sequence[Regression], run_url: str) -> str:
    rows = ["| cell | test | run | compared with | what changed |", "|---|---|---|---|---|"]
    for g in items:
        changes = "<br>".join(code(c) for c in stack_changes(g.good_stack, g.bad_stack)[:6]) or "nothing recorded"
        run = f"[{code(g.run_id)}]({run_url})" if run_url else code(g.run_id)
        rows.append(f"| {code(g.cell_id)} | {code(g.test_id)} | {run} | {code(g.result.compared_run or '-')} | {changes} |")
    return "\n".join(rows)


def _excerpt_block(text: str) -> str:
    lines = (text or "(no output recorded)").strip().splitlines()[:EXCERPT_LINES]
    return "~~~text\n" + "\n".join(line.replace("~~~", "~ ~ ~") for line in lines) + "\n~~~"


def issue_title(signature: str) -> str:
    short = signature if len(signature) <= 90 else signature[:87] + "..."
    return f"[distci] regression: {short}"


def issue_body(signature: str, items: Sequence[Regression], run_url: str, bisect_notes: Sequence[str]) -> str:
    first = items[0]
    parts = [
        f"distci found a test that passed in the previous run of its cell and fails now.\n\n"
        f"**Error signature** (one issue per signature; new occurrences are added as comments):\n\n"
        f"~~~text\n{signature}\n~~~",
        _occurrence_table(items, run_url),
        f"**Reproduce** (from a checkout, on the cell's runner):\n\n~~~sh\n{first.result.repro}\n~~~",
        f"**Why it is a regression:** {first.result.verdict_reason}",
        "**Failure** (first occurrence):\n\n" + _excerpt_block(first.result.excerpt),
        "**Bisect:**\n\n" + "\n".join(f"- {n}" for n in bisect_notes),
        "\n".join([marker("signature", issue_key(first)), *(marker("occurrence", occurrence_key(g)) for g in items)]),
    ]
    return _fit("\n\n".join(parts))


def occurrence_comment(items: Sequence[Regression], run_url: str, bisect_notes: Sequence[str], *,
                       again: bool) -> str:
    head = ("Regressed again (this issue was closed)." if again
            else f"Seen again: {len(items)} new occurrence{'s' if len(items) != 1 else ''}.")
    parts = [head, _occurrence_table(items, run_url)]
    if bisect_notes:
        parts.append("**Bisect:**\n\n" + "\n".join(f"- {n}" for n in bisect_notes))
    parts.append("\n".join(marker("occurrence", occurrence_key(g)) for g in items))
    return _fit("\n\n".join(parts))


def _fit(body: str) -> str:
    """GitHub refuses bodies over 65536 characters; the markers at the end must survive."""
    if len(body) <= MAX_BODY:
        return body
    tail_at = body.rfind("\n\n<!-- distci:")
    tail = body[tail_at:] if tail_at >= 0 else ""
    return body[: MAX_BODY - len(tail) - 40] + "\n\n(truncated)" + tail



@dataclass
class FilingReport:
    opened: list[int] = field(default_factory=list)
    updated: list[int] = field(default_factory=list)
    unchanged: list[int] = field(default_factory=list)
    bisects: list[dict[str, str]] = field(default_factory=list)


def file_regressions(found: Sequence[Regression], tracker: Tracker, *, ref: str, run_url: str = "",
                     workflow: str = BISECT_WORKFLOW, max_bisects: int = 4) -> FilingReport:
    """One issue per signature, one comment per batch of new occurrences, one bisect per new plan.

    Everything written carries a marker, and everything already marked is skipped, so a
    rerun of the same artifacts (or of a job that failed half-way) writes only what is
    missing: a dispatch that failed is retried, an issue is never opened twice.
    """
    report = FilingReport()
    if not found:
        return report
    tracker.ensure_label()
    existing = tracker.issues_by_signature()
    groups: dict[str, list[Regression]] = {}
    for g in found:
        groups.setdefault(g.signature, []).append(g)
    budget = max_bisects
    for signature, items in groups.items():
        issue = existing.get(issue_key(items[0]))
        if issue is not None:
            tracker.load_comment_markers(issue)
        new = [g for g in items if issue is None or f"occurrence={occurrence_key(g)}" not in issue.markers]
        plans = _bisect_plans(items, issue)
        chosen, budget = plans[:max(budget, 0)], budget - len(plans)
        notes = [f"{p.axis} {code(p.good)} .. {code(p.bad)} on {code(p.cell_id)} for {code(p.test_id)}: "
                 + ("dispatching bisect.yml" if p in chosen else f"not dispatched (over {max_bisects} a night)")
                 for p in plans]
        if not plans and new:
            notes = ["not dispatched: no package version differs between the good and the bad run "
                     "(see `what changed`: the image, driver or runner did)"]
        if issue is None:
            issue = tracker.open_issue(issue_title(signature), issue_body(signature, new, run_url, notes))
            report.opened.append(issue.number)
        elif new:
            again = issue.state != "open"
            tracker.comment(issue, occurrence_comment(new, run_url, notes, again=again), reopen=again)
            report.updated.append(issue.number)
        elif not chosen:
            report.unchanged.append(issue.number)
        for plan in chosen:
            tracker.dispatch(workflow, ref, plan.inputs(issue.number))
            tracker.comment(issue, f"Bisect dispatched: {plan.axis} {code(plan.good)} .. {code(plan.bad)} on "
                                   f"{code(plan.cell_id)} for {code(plan.test_id)}.\n\n{marker('bisect', plan.key)}")
            report.bisects.append(plan.inputs(issue.number))
    return report


def _bisect_plans(items: Sequence[Regression], issue: Issue | None) -> list[BisectPlan]:
    """One plan per cell (from the first test that regressed there), unless already dispatched."""
    plans: list[BisectPlan] = []
    seen: set[str] = set()
    for g in items:
        plan = bisect_plan(g)
        if plan is None or plan.cell_id in seen:
            continue
        seen.add(plan.cell_id)
        if issue is None or f"bisect={plan.key}" not in issue.markers:
            plans.append(plan)
    return plans

