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

import datetime
import fnmatch
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from distci.errors import RegistryError
from distci.signatures import SEARCH_BUDGET_S, alternatives, compile_signature, required_words, search
from distci.sources import nightly_date_of
from distci.stack import Stack
from distci.tomlloc import Locator, read as read_toml, suggest

MAX_REGISTRY_BYTES = 16 << 20
"""A registry is a few hundred entries (tens of KB): a bigger file is the wrong file."""
ACCELERATORS = ("cpu", "cuda", "npu")


def _kind(value: Any) -> str:
    return {str: "a string", list: "a list", dict: "a table", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else f"must be a string (got {_kind(value)})"


def _name(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return f"must be a non-empty string like \"pytorch12345-what-breaks\" (got {value!r})"
    return None


def _strings(value: Any) -> str | None:
    listed = value if isinstance(value, list) else [value]
    if not listed or not all(isinstance(v, str) and v for v in listed):
        return f"must be a non-empty string or a list of them (got {value!r})"
    return None


def _pattern(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a regex string (got {_kind(value)})"
    try:
        compile_signature(value)
    except ValueError as exc:
        return str(exc)
    return None


def _specifier(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a PEP 440 specifier string like \">=2.12,<2.15\" (got {_kind(value)})"
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        return f"= {value!r} is not a version specifier (write e.g. \">=2.12,<2.15\")"
    return None


def _date(value: Any) -> str | None:
    if isinstance(value, datetime.date):
        return f"must be a quoted date string (write \"{value.isoformat()}\")"
    try:
        datetime.date.fromisoformat(value if isinstance(value, str) else "")
        return None
    except ValueError:
        return f"= {value!r} is not a date like \"2026-11-20\""


def _accelerators(value: Any) -> str | None:
    listed = value if isinstance(value, list) else None
    if not listed or not all(isinstance(v, str) for v in listed):
        return f"must be a list of accelerators like [\"cuda\"] (got {value!r})"
    bad = [v for v in listed if v not in ACCELERATORS]
    return f"has '{bad[0]}'{suggest(bad[0], ACCELERATORS)}; one of: {', '.join(ACCELERATORS)}" if bad else None


def _table(value: Any) -> str | None:
    return None if isinstance(value, dict) else f"must be a table ([issue.applies]) (got {_kind(value)})"


@dataclass(frozen=True)
class Key:
    """One key of an [[issue]] entry or of its applies table: how a value is checked."""

    name: str
    check: Callable[[Any], str | None]
    """What is wrong with a value (completing "'<key>' ..."), or None."""
    required: bool = False
    help: str = ""


ENTRY = (
    Key("id", _name, True, 'e.g. id = "pytorch12345-what-breaks"'),
    Key("title", _text),
    Key("tests", _strings, True, 'fnmatch patterns of test ids, e.g. tests = ["suites/test_x.py::*"]'),
    Key("not_tests", _strings),
    Key("signature", _pattern, True, "a regex searched in the failure's message"),
    Key("consequences", _pattern),
    Key("applies", _table),
    Key("upstream", _text),
    Key("fix", _text),
    Key("repro", _text),
)
"""The keys of an [[issue]] entry (the schema at the top of suites/known_issues.toml)."""
APPLIES = (
    Key("torch", _specifier),
    Key("torchao", _specifier),
    Key("torchtitan", _specifier),
    Key("nightly_from", _date),
    Key("nightly_until", _date),
    Key("git", _strings),
    Key("accelerators", _accelerators),
)
"""The keys of an entry's [issue.applies] table; every key given must hold."""


def _listed(value: str | list[str]) -> list[str]:
    return value if isinstance(value, list) else [value]


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


JUDGE_WORDS = frozenset("""
    step microbatch loss eval logits vs reference gradient grad total norm relative error sqnr db max diff ref
    at action the of is parameter leaves first divergence forward output input value differs by threshold rounding
    bound problem problems inf nan
    sweep died on this case
    finite where reference's overflowed""".split())
"""The words the suites' judges write about ANY numeric difference (suites/checks.py's loss and
gradient lines, the generators' `at action`, suites/localize.py's `leaves the reference first`,
the ops judge's `gradient of input N: value: differs by`, the ops generator's `the sweep died on this case`, which any
crash, hang or timeout of any op gets; the programs' loss-scaling judge's `gradient X is finite where the
reference's overflowed`, which any disagreement on an overflow gets): a failure whose text an entry matched with these words
only (and numbers) says that a number moved, not which bug moved it."""


def names_a_bug(words: list[str]) -> bool:
    """Whether a signature's words hold one the judges do not write about every numeric
    difference: `never averaged over the ranks` does, `gradient SQNR` and `step N: loss N vs
    reference` do not (a lone letter, an `N` or a number like `1e` never counts)."""
    return any(len(w) > 1 and not w[0].isdigit() and w.lower() not in JUDGE_WORDS for w in words)


def _nightly_yyyymmdd(version: str) -> str | None:
    """YYYYMMDD of a nightly build (the bounds' form), from the one parser (distci.sources)."""
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
    date = _nightly_yyyymmdd(version)
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


def _fix_applied(stack: Stack, fix_id: str) -> bool:
    for entry in stack.fixes or []:
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
    where: str = ""
    """`file:line` of the entry, for the lines that name it."""
    stalled: str = ""
    """Set when a search of its patterns ran out of time: then it explains nothing more."""

    def applies_to(self, stack: Stack) -> bool:
        """Whether the bug is expected to show on this stack.

        When the stack's fix package applied this entry's fix, the bug is masked and a
        pass is the expected outcome, not news: the entry does not apply.
        """
        return self.why_not(stack) is None

    def why_not(self, stack: Stack) -> str | None:
        """Why the entry does not apply to this stack (None: it applies), in words a
        person acts on: the condition and what the stack has."""
        if self.fix and _fix_applied(stack, self.fix):
            return f"its fix {self.fix} is applied in this stack"
        a = self.applies
        accel = a.get("accelerators")
        if accel:
            here = "cuda" if stack.cuda_available else ("npu" if stack.torch_npu else "cpu")
            if here not in accel:
                return f"applies on {', '.join(accel)}; this stack is {here}"
        git = a.get("git")
        if git and stack.torch_git and not any(str(stack.torch_git).startswith(g) for g in git):
            return f"applies to torch git {', '.join(git)}; this stack has {stack.torch_git}"
        for pkg in ("torch", "torchao", "torchtitan"):
            spec = a.get(pkg)
            if pkg == "torch":
                nightly = {k: a[k] for k in ("nightly_from", "nightly_until") if a.get(k)}
                if (spec or nightly) and not version_applies(stack.torch, spec, nightly_from=a.get("nightly_from"),
                                                             nightly_until=a.get("nightly_until")):
                    cond = " ".join([f"torch {spec}" if spec else "torch"] + [f"{k} {v}" for k, v in nightly.items()])
                    return f"applies to {cond}; this stack has torch {stack.torch}"
            elif spec and not version_applies(stack.get(pkg), spec):
                return f"applies to {pkg} {spec}; this stack has {pkg} {stack.get(pkg)}"
        return None

    def covers(self, test_id: str) -> bool:
        return (any(fnmatch.fnmatchcase(test_id, pat) for pat in self.tests)
                and not any(fnmatch.fnmatchcase(test_id, pat) for pat in self.not_tests))

    def explains(self, text: str) -> bool:
        """Whether the entry's signature is in `text`, whitespace normalized on both sides:
        torch 2.11 breaks a message's line inside the signature ("guessed its\nmetadata")."""
        return self._found(self.signature, "signature", text)

    @functools.cached_property
    def specific(self) -> list[re.Pattern[str]]:
        """The top-level alternatives of the signature whose required text names a bug
        (`names_a_bug`): `never averaged over the ranks` of `never averaged over the ranks|gradient SQNR`."""
        try:
            alts = [re.compile(a, self.signature.flags) for a in alternatives(self.signature.pattern)]
        except re.error:  # a split the parser reads otherwise: judge the pattern whole
            alts = [self.signature]
        return [a for a in alts if names_a_bug(required_words(a.pattern))]

    def names_the_bug_in(self, signature: str) -> bool:
        """Whether one of the entry's `specific` alternatives is in a failure's error signature
        (its headline, `results.headline`): what lets a find outside the entry's tests be called
        its near miss. A match of the judges' generic words only (`gradient SQNR`) says a number
        moved, not which bug moved it. Bounded like `explains`."""
        return any(self._found(alt, "signature", signature) for alt in self.specific)

    def caused(self, problem: str) -> bool:
        """Whether a problem line is one of this bug's downstream `consequences`."""
        return self.consequences is not None and self._found(self.consequences, "consequences", problem)

    def _found(self, pattern: re.Pattern[str], key: str, text: str) -> bool:
        """A bounded search (distci.signatures), raw text then whitespace-normalized;
        one that runs out of time disables the entry (its failures stay failures) and says so."""
        for candidate in (text, normalize_space(text)):
            if self.stalled:
                return False
            hit = search(pattern, candidate)
            if hit is None:
                self.stalled = (f"{self.where or 'known issues'}: [[issue]] {self.id}: '{key}' ran over "
                                f"{SEARCH_BUDGET_S:g} s on one message; it explains nothing until rewritten "
                                "(no repeated groups that repeat, fewer '.*')")
                return False
            if hit:
                return True
        return False


@dataclass
class Registry:
    entries: list[KnownIssue]

    reported: set[str] = field(default_factory=set)

    def stalls(self) -> list[str]:
        """One line per entry whose search ran out of time (see KnownIssue.stalled)."""
        return [e.stalled for e in self.entries if e.stalled]

    def new_stalls(self) -> list[str]:
        """The stalls() lines not returned by an earlier call: each is named once per process."""
        fresh = [line for line in self.stalls() if line not in self.reported]
        self.reported.update(fresh)
        return fresh

    def match(self, test_id: str, signature: str, message: str, stack: Stack) -> str | None:
        return self._match(test_id, signature, message, self.applicable(test_id, stack))

    def missed_by_stack(self, test_id: str, signature: str, message: str, stack: Stack) -> list[str]:
        """For a failure no entry explains: the entries covering the test that would explain
        it but for where they apply (a version range drawn too narrow, a fix applied), each
        with why not. A range that missed a stack outside the ones it was measured on shows
        up here instead of as an unexplained failure somebody must trace by hand."""
        if self.match(test_id, signature, message, stack) is not None:
            return []
        anywhere = self._match(test_id, signature, message, [e for e in self.entries if e.covers(test_id)])
        by_id = {e.id: e for e in self.entries}
        return [f"{i} ({by_id[i].why_not(stack)})" for i in (anywhere or "").split(",")
                if i and not by_id[i].applies_to(stack)]

    def near_misses(self, test_id: str, signature: str, message: str, stack: Stack) -> list[str]:
        """THE near-miss rule, for every generator's finds and the nightly's filing: the ids of
        the entries a failure no entry explains repeats through another door. An entry counts
        when it applies to this stack, its tests do not name this test, and its signature is
        in the failure's error signature (its headline: the problems listed below it are
        sentences many bugs share) through words that name a bug (`KnownIssue.names_the_bug_in`).
        An entry matched only by the judges' generic words (`gradient SQNR`, `loss N vs
        reference`) leans on its test patterns to say which bug it is, so any numeric difference
        elsewhere would look like it: such a failure stays a find, to be triaged and filed."""
        if not signature or self.match(test_id, signature, message, stack) is not None:
            return []
        return [e.id for e in self.entries
                if not e.covers(test_id) and e.applies_to(stack) and e.names_the_bug_in(signature)]

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

    def applicable(self, test_id: str, stack: Stack) -> list[KnownIssue]:
        return [e for e in self.entries if e.covers(test_id) and e.applies_to(stack)]

    def known_issue_of(self, test_id: str, outcome: str, *, signature: str | None, message: str,
                       stack: Stack, failure_kind: str | None = None) -> str | None:
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
    """The registry at `path`, validated against ENTRY / APPLIES: any mistake is one
    RegistryError naming file:line, the entry and the key, and what to write instead."""
    path = Path(path)
    data, loc = read_toml(path, kind=RegistryError, max_bytes=MAX_REGISTRY_BYTES,
                          missing="point --known-issues at suites/known_issues.toml")
    for key in data:
        if key != "issue":
            raise RegistryError(f"unknown top-level key '{key}'{suggest(key, ['issue'])}; the registry holds "
                                "[[issue]] entries only", where=loc.where(loc.line_of(None, key)))
    raw_entries = data.get("issue", [])
    if not isinstance(raw_entries, list) or not all(isinstance(e, dict) for e in raw_entries):
        raise RegistryError("'issue' must be an array of tables ([[issue]])", where=loc.where(loc.line_of(None, "issue")))
    entries: list[KnownIssue] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(raw_entries):
        entry = _entry(raw, i, loc)
        if entry.id in seen:
            raise RegistryError(f"[[issue]] {entry.id}: duplicate id (first at {seen[entry.id]}); ids name results "
                                "and pages, so give this entry its own", where=entry.where)
        seen[entry.id] = entry.where
        entries.append(entry)
    return Registry(entries)


def _entry(raw: dict[str, Any], index: int, loc: Locator) -> KnownIssue:
    """One [[issue]] table checked against ENTRY and APPLIES, as a KnownIssue."""
    name = raw.get("id") if isinstance(raw.get("id"), str) and raw.get("id") else f"#{index + 1}"
    _check_table(raw, ENTRY, f"[[issue]] {name}", lambda key: loc.where(loc.entry_line("issue", index, key)))
    applies = raw.get("applies", {})
    _check_table(applies, APPLIES, f"[[issue]] {name}: applies",
                 lambda key: loc.where(loc.entry_line("issue", index, key, table="applies")))
    where = loc.where(loc.entry_line("issue", index))
    return KnownIssue(raw["id"], _listed(raw["tests"]), compile_signature(raw["signature"]), applies,
                      raw.get("upstream", ""), raw.get("fix"), raw.get("title", ""),
                      compile_signature(raw["consequences"]) if "consequences" in raw else None,
                      _listed(raw.get("not_tests", [])), where=where)


def _check_table(table: dict[str, Any], keys: tuple[Key, ...], label: str, where_of: Callable[[str | None], str]) -> None:
    by_name = {k.name: k for k in keys}
    for key, value in table.items():
        spec = by_name.get(key)
        if spec is None:
            hint = suggest(key, by_name) or f"; allowed: {', '.join(by_name)}"
            raise RegistryError(f"{label}: unknown key '{key}'{hint}", where=where_of(key))
        problem = spec.check(value)
        if problem:
            raise RegistryError(f"{label}: '{key}' {problem}", where=where_of(key))
    for spec in keys:
        if spec.required and spec.name not in table:
            raise RegistryError(f"{label}: missing key '{spec.name}' ({spec.help})", where=where_of(None))


def result_known_issue(r: Any, registry: "Registry | None") -> str | None:
    """The known issue a Result matches by today's registry, through the one matcher
    (Registry.known_issue_of); without a registry, what was recorded. Shared by ingest
    (judge/runreader.py) and the evidence pages (run/runreport.py)."""
    if registry is None:
        return r.known_issue
    return registry.known_issue_of(r.test_id, r.outcome, signature=r.error_signature, message=r.message,
                                   stack=r.stack, failure_kind=r.failure_kind)

