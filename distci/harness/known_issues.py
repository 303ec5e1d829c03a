"""The known-issues registry: which failures are upstream bugs we already know.

A failure becomes `xfail` only when the test id, the error signature AND the stack all
match an entry; anything else stays a failure, so a known issue never hides a new error.
Where an entry applies and the test passes, the verdict is `fixed`: the entry (or the
fix) can be retired.

A failure that lists several problems (the suites' `require()`: "<what>: N problem(s)"
and one indented line each) is xfail only when every listed problem is explained by an
applicable entry; the result then names all of them, comma-separated. One listed problem
that no entry explains (or a list cut short, "... and N more") keeps it a failure.

Applicability needs two kinds of bounds: release specifiers (PEP 440) and nightly-date /
commit bounds, because `2.12.0.dev20260301` or `2.13.0a0+gitabc1234` cannot be placed
by a specifier alone.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from distci.provision.index import nightly_date_of

ENTRY_KEYS = {"id", "tests", "not_tests", "signature", "applies", "upstream", "fix", "title", "repro", "consequences"}
APPLIES_KEYS = {"torch", "torchao", "torchtitan", "nightly_from", "nightly_until", "git", "accelerators"}


_PROBLEMS_HEADER = re.compile(r": \d+ problem\(s\)$")


def problem_lines(message: str) -> list[str] | None:
    """The listed problems of a multi-problem failure message, or None for any other message."""
    lines = message.splitlines()
    for i, line in enumerate(lines):
        if _PROBLEMS_HEADER.search(line):
            listed = []
            for item in lines[i + 1:]:
                if not item.startswith("  "):
                    break
                listed.append(item.strip())
            return listed or None
    return None


def normalize_space(text: str) -> str:
    """Every run of whitespace (newlines included) as one space, ends stripped."""
    return " ".join(text.split())


class RegistryError(ValueError):
    """known_issues.toml is malformed; the message names the entry and key."""


def nightly_date(version: str) -> str | None:
    """YYYYMMDD of a nightly build, from the one nightly-date parser (provision.index)."""
    day = nightly_date_of(version)
    return day.replace("-", "") if day else None


def version_applies(version: str | None, spec: str | None, *, nightly_from: str | None = None,
                    nightly_until: str | None = None) -> bool:
    """True when `version` is inside the release specifier, or (for a dev build) inside the dates.

    A nightly (X.Y.0.devYYYYMMDD) is judged by its date when date bounds are given,
    otherwise by its release part against the specifier (prereleases allowed).
    """
    if version is None:
        return False
    if spec is None and nightly_from is None and nightly_until is None:
        return True
    date = nightly_date(version)
    if date and (nightly_from or nightly_until):
        lo = (nightly_from or "00000000").replace("-", "")
        hi = (nightly_until or "99999999").replace("-", "")
        return lo <= date <= hi
    if spec is None:
        return False
    try:
        v = Version(version)
    except InvalidVersion:
        return False
    return SpecifierSet(spec).contains(Version(v.base_version), prereleases=True)


def _fix_applied(stack: dict[str, Any], fix_id: str) -> bool:
    for entry in stack.get("fixes") or []:
        if isinstance(entry, dict) and entry.get("id") == fix_id and entry.get("status") == "applied":
            return True
    return False


@dataclass
class KnownIssue:
    id: str
    tests: list[str]
    signature: re.Pattern[str]
    applies: dict[str, Any] = field(default_factory=dict)
    upstream: str = ""
    fix: str | None = None
    title: str = ""
    consequences: re.Pattern[str] | None = None
    """Problem lines the bug causes downstream (a frozen weight that trains moves every later
    step's loss): explained by this entry only in a failure where its signature explains
    another line, the root, so such a line alone never reads as known."""
    not_tests: list[str] = field(default_factory=list)
    """Tests inside `tests` the bug cannot reach (with a frozen embedding the backward that
    breaks never runs): their passes would read as `fixed` and claim the bug gone."""

    def applies_to(self, stack: dict[str, Any]) -> bool:
        """Whether the bug is expected to show on this stack.

        When the stack's fix package applied this entry's fix, the bug is masked and a
        pass is the expected outcome, not news: the entry does not apply.
        """
        return self.why_not(stack) is None

    def why_not(self, stack: dict[str, Any]) -> str | None:
        """Why the entry does not apply to this stack (None: it applies), in words a
        person acts on: the condition and what the stack has."""
        if self.fix and _fix_applied(stack, self.fix):
            return f"its fix {self.fix} is applied in this stack"
        a = self.applies
        accel = a.get("accelerators")
        if accel:
            here = "cuda" if stack.get("cuda_available") else ("npu" if stack.get("torch_npu") else "cpu")
            if here not in accel:
                return f"applies on {', '.join(accel)}; this stack is {here}"
        git = a.get("git")
        if git and stack.get("torch_git") and not any(str(stack["torch_git"]).startswith(g) for g in git):
            return f"applies to torch git {', '.join(git)}; this stack has {stack['torch_git']}"
        for pkg in ("torch", "torchao", "torchtitan"):
            spec = a.get(pkg)
            if pkg == "torch":
                nightly = {k: a[k] for k in ("nightly_from", "nightly_until") if a.get(k)}
                if (spec or nightly) and not version_applies(stack.get("torch"), spec, nightly_from=a.get("nightly_from"),
                                                             nightly_until=a.get("nightly_until")):
                    cond = " ".join([f"torch {spec}" if spec else "torch"] + [f"{k} {v}" for k, v in nightly.items()])
                    return f"applies to {cond}; this stack has torch {stack.get('torch')}"
            elif spec and not version_applies(stack.get(pkg), spec):
                return f"applies to {pkg} {spec}; this stack has {pkg} {stack.get(pkg)}"
        return None

    def covers(self, test_id: str) -> bool:
        return (any(fnmatch.fnmatchcase(test_id, pat) for pat in self.tests)
                and not any(fnmatch.fnmatchcase(test_id, pat) for pat in self.not_tests))

    def explains(self, text: str) -> bool:
        """Whether the entry's signature is in `text`, whitespace normalized on both sides:
        torch 2.11 breaks a message's line inside the signature ("guessed its\nmetadata")."""
        return bool(self.signature.search(text) or self.signature.search(normalize_space(text)))

    def caused(self, problem: str) -> bool:
        """Whether a problem line is one of this bug's downstream `consequences`."""
        return self.consequences is not None and bool(
            self.consequences.search(problem) or self.consequences.search(normalize_space(problem)))


@dataclass
class Registry:
    entries: list[KnownIssue]

    def match(self, test_id: str, signature: str, message: str, stack: dict[str, Any]) -> str | None:
        return self._match(test_id, signature, message, self.applicable(test_id, stack))

    def near_miss(self, test_id: str, signature: str, message: str, stack: dict[str, Any]) -> list[str]:
        """For a failure no entry explains: the entries that would, but for where they
        apply (a version range drawn too narrow, a fix applied), each with why not. A
        range that missed a stack outside the ones it was measured on shows up here
        instead of as an unexplained failure somebody must trace by hand."""
        if self.match(test_id, signature, message, stack) is not None:
            return []
        anywhere = self._match(test_id, signature, message, [e for e in self.entries if e.covers(test_id)])
        by_id = {e.id: e for e in self.entries}
        return [f"{i} ({by_id[i].why_not(stack)})" for i in (anywhere or "").split(",")
                if i and not by_id[i].applies_to(stack)]

    def explained_elsewhere(self, test_id: str, signature: str, message: str, stack: dict[str, Any]) -> list[str]:
        """For a failure no entry explains: the entries applying to this stack whose signature is
        in its error signature (its first line: the problems listed below it are generic
        sentences many entries share) though their test patterns do not name this test (a
        generator's find of a registered bug through another door), each with why it did not
        match. Such a find is that entry's near miss: reported under its id, never filed as new."""
        if not signature or self.match(test_id, signature, message, stack) is not None:
            return []
        return [f"{e.id} (its tests do not name {test_id})" for e in self.entries
                if not e.covers(test_id) and e.applies_to(stack) and e.explains(signature)]

    def _match(self, test_id: str, signature: str, message: str, candidates: list[KnownIssue]) -> str | None:
        """The entries among `candidates` (covering the test, in registry order) that explain
        the failure: one whose signature is in it, or for a failure that lists its problems,
        one for every problem line (or its root's consequences)."""
        problems = problem_lines(message)
        if problems is None:
            return next((e.id for e in candidates if e.explains(signature) or e.explains(message)), None)
        explained = [next((e for e in candidates if e.explains(problem)), None) for problem in problems]
        roots = [e for e in candidates if e in explained and e.consequences is not None]
        ids: list[str] = []
        for problem, entry in zip(problems, explained):
            if entry is None:
                entry = next((e for e in roots if e.caused(problem)), None)
            if entry is None:
                return None
            if entry.id not in ids:
                ids.append(entry.id)
        return ",".join(ids)

    def applicable(self, test_id: str, stack: dict[str, Any]) -> list[KnownIssue]:
        return [e for e in self.entries if e.covers(test_id) and e.applies_to(stack)]

    def known_issue_of(self, test_id: str, outcome: str, *, signature: str | None, message: str,
                       stack: dict[str, Any], failure_kind: str | None = None) -> str | None:
        """THE matcher: the known issue a test's outcome stands for, used by the harness's
        recorder, the external runner and ingest alike. A failure (not infra) names the
        entries that explain it (test, signature, stack); a pass where an entry applies
        names it, so the verdict is `fixed` and the entry (or its fix) can be retired."""
        if failure_kind == "infra":
            return None
        if outcome == "failed":
            return self.match(test_id, signature or "", message, stack)
        if outcome == "passed":
            applicable = self.applicable(test_id, stack)
            return applicable[0].id if applicable else None
        return None


def load_registry(path: Path) -> Registry:
    where = str(path)
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{where}: {exc}") from None
    entries = []
    for i, raw in enumerate(data.get("issue", [])):
        label = f"{where}: [[issue]] #{i + 1} ({raw.get('id', '?')})"
        unknown = set(raw) - ENTRY_KEYS
        if unknown:
            raise RegistryError(f"{label}: unknown key(s) {sorted(unknown)}; allowed: {sorted(ENTRY_KEYS)}")
        for key in ("id", "tests", "signature"):
            if key not in raw:
                raise RegistryError(f"{label}: missing key {key!r}")
        applies = raw.get("applies", {})
        unknown = set(applies) - APPLIES_KEYS
        if unknown:
            raise RegistryError(f"{label}: unknown key(s) in applies {sorted(unknown)}; allowed: {sorted(APPLIES_KEYS)}")
        for pkg in ("torch", "torchao", "torchtitan"):
            if pkg in applies:
                try:
                    SpecifierSet(applies[pkg])
                except InvalidSpecifier:
                    raise RegistryError(f"{label}: applies.{pkg} = {applies[pkg]!r} is not a version specifier") from None
        try:
            sig = re.compile(raw["signature"])
        except re.error as exc:
            raise RegistryError(f"{label}: signature is not a valid regex: {exc}") from None
        try:
            consequences = re.compile(raw["consequences"]) if "consequences" in raw else None
        except re.error as exc:
            raise RegistryError(f"{label}: consequences is not a valid regex: {exc}") from None
        tests = raw["tests"] if isinstance(raw["tests"], list) else [raw["tests"]]
        not_tests = raw.get("not_tests", [])
        not_tests = not_tests if isinstance(not_tests, list) else [not_tests]
        entries.append(KnownIssue(raw["id"], tests, sig, applies, raw.get("upstream", ""), raw.get("fix"), raw.get("title", ""),
                                  consequences, not_tests))
    return Registry(entries)


def result_known_issue(r: Any, registry: "Registry | None") -> str | None:
    """The known issue a Result matches by today's registry, through the one matcher
    (Registry.known_issue_of); without a registry, what was recorded. Shared by ingest
    (judge/runreader.py) and the evidence pages (run/runreport.py)."""
    if registry is None:
        return r.known_issue
    return registry.known_issue_of(r.test_id, r.outcome, signature=r.error_signature, message=r.message,
                                   stack=r.stack, failure_kind=r.failure_kind)

