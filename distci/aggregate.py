"""The nightly aggregate: every cell's results in; verdicts, issues, bisects and the dashboard out.

It is the logic of the `aggregate` job of .github/workflows/nightly.yml (and of the
`record` job of bisect.yml), kept here so it runs, and is tested, on any machine:

1. **History.** The JSONL files are the source of truth and live on a git branch of the
   repository (`distci-data`): `runs/<run-id>/` (results.jsonl, run.json, stack.json,
   junit.xml) and `bisect/*.json`. A branch needs nothing but `contents: write`, keeps
   every night forever, and can be read with plain git. Tonight's run directories are
   added (append-only: a results.jsonl that is not a continuation of the stored one is
   refused), then the branch is pushed, retrying on a concurrent push.
2. **Store.** The SQLite store is an index over those files, rebuilt from them at each
   aggregate (distci.store), so it is never persisted and never goes stale.
3. **Regressions.** Results of tonight's runs whose verdict is `regression`.
4. **Issues.** One issue per error signature, found again by a hidden marker in its
   body, so the same bug in six cells or on three nights is one issue; every occurrence
   (run, test) is recorded once by its own marker, so aggregating the same artifacts
   twice posts nothing twice. GitHub's REST API is reached at $GITHUB_API_URL (set by
   Actions; a local fake server in tests), with the token from $GITHUB_TOKEN.
5. **Bisects.** For a new occurrence whose good and bad stacks differ in a package
   version, bisect.yml is dispatched (workflow_dispatch) with that axis and endpoints.
6. **Dashboard.** Rendered from the store for GitHub Pages.

`--dry-run` reads what it needs and prints what it would write, push and dispatch.
A matrix cell that uploaded nothing (dead runner, cancelled job) gets an `infra` run,
so it shows on the dashboard as a cell that could not run, never as a pass.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from distci.errors import ConfigError, DistciError, InfraError, SelectionError, StoreError
from distci.results import Result, error_signature
from distci.rundir import RESULTS_FILE, RUN_FILE, RUN_FILES, STACK_FILE, RunDir, find_run_dirs
from distci.store import Store, nightly_date_of
from distci.verdicts import ENV_KEYS

DATA_BRANCH = "distci-data"
ISSUE_LABEL = "distci-regression"
LABEL_COLOR = "b60205"
BISECT_WORKFLOW = "bisect.yml"
BISECT_AXES = ("torch", "torchao", "torchtitan", "torch_npu")
DEFAULT_API_URL = "https://api.github.com"
API_VERSION = "2022-11-28"
MAX_BODY = 60_000
EXCERPT_LINES = 60
GIT_IDENTITY = ("github-actions[bot]", "41898282+github-actions[bot]@users.noreply.github.com")
PUSH_ATTEMPTS = 4

Log = Callable[[str], None]

_MARKER_RE = re.compile(r"<!-- distci:([a-z-]+)=([0-9a-f]+) -->")


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _marker(kind: str, key: str) -> str:
    return f"<!-- distci:{kind}={key} -->"


def markers(text: str) -> set[str]:
    """The distci markers (`kind=key`) hidden in an issue body or comment."""
    return {f"{k}={v}" for k, v in _MARKER_RE.findall(text or "")}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def workflow_run_url(environ: Mapping[str, str] | None = None) -> str:
    """The URL of the current Actions run (empty outside Actions)."""
    env = os.environ if environ is None else environ
    server, repo, run = env.get("GITHUB_SERVER_URL"), env.get("GITHUB_REPOSITORY"), env.get("GITHUB_RUN_ID")
    return f"{server}/{repo}/actions/runs/{run}" if server and repo and run else ""


# --------------------------------------------------------------------------- GitHub


@dataclass
class GitHub:
    """The few REST endpoints distci needs, over urllib (no client library to pin).

    Errors become one ConfigError line naming the endpoint, the status and the
    permission the job most likely lacks; the token never appears in messages.
    """

    repo: str
    token: str = field(repr=False)
    api_url: str = DEFAULT_API_URL
    timeout: float = 30.0
    retries: int = 3

    @classmethod
    def from_env(cls, repo: str | None = None, api_url: str | None = None,
                 environ: Mapping[str, str] | None = None) -> "GitHub":
        env = os.environ if environ is None else environ
        repo = repo or env.get("GITHUB_REPOSITORY", "")
        token = env.get("GITHUB_TOKEN") or env.get("GH_TOKEN") or ""
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
            raise ConfigError("no repository: set GITHUB_REPOSITORY=owner/name or pass --repo")
        if not token:
            raise ConfigError("no GitHub token: set GITHUB_TOKEN (in Actions: env GITHUB_TOKEN: ${{ github.token }})")
        return cls(repo=repo, token=token, api_url=(api_url or env.get("GITHUB_API_URL") or DEFAULT_API_URL))

    def _url(self, path: str, query: Mapping[str, Any] | None = None) -> str:
        url = f"{self.api_url.rstrip('/')}/repos/{self.repo}{path}"
        return f"{url}?{urllib.parse.urlencode(query)}" if query else url

    def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                *, url: str | None = None, allow: tuple[int, ...] = ()) -> tuple[int, Any, str]:
        """(status, decoded JSON or None, Link header). Statuses in `allow` are returned, not raised."""
        target = url or self._url(path, query)
        data = json.dumps(body).encode() if body is not None else None
        headers = {
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {self.token}",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "distci",
        }
        if data is not None:
            headers["Content-Type"] = "application/json"
        # Only reads are retried: a write that timed out may have happened.
        attempts = self.retries if method == "GET" else 1
        for attempt in range(attempts):
            req = urllib.request.Request(target, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                    return resp.status, (json.loads(raw) if raw else None), resp.headers.get("Link", "")
            except urllib.error.HTTPError as exc:
                raw = exc.read()
                if exc.code in allow:
                    return exc.code, (json.loads(raw) if raw.strip().startswith(b"{") else None), ""
                if exc.code >= 500 and attempt + 1 < attempts:
                    time.sleep(2 ** attempt)
                    continue
                raise ConfigError(self._explain(method, path, exc.code, raw)) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                if attempt + 1 < attempts:
                    time.sleep(2 ** attempt)
                    continue
                reason = getattr(exc, "reason", exc)
                raise ConfigError(f"GitHub API at {self.api_url} is not reachable ({reason}); "
                                  "check GITHUB_API_URL") from None
        raise AssertionError("unreachable")

    def _explain(self, method: str, path: str, status: int, raw: bytes) -> str:
        try:
            message = json.loads(raw).get("message", "")
        except (ValueError, AttributeError):
            message = raw[:200].decode(errors="replace")
        need = {"/issues": "issues: write", "/labels": "issues: write", "/actions/": "actions: write"}
        perm = next((p for prefix, p in need.items() if path.startswith(prefix)), "")
        hint = f"; the job needs `permissions: {perm}`" if perm and status in (403, 404) and method != "GET" else ""
        return f"GitHub API {method} /repos/{self.repo}{path}: HTTP {status} {message}".rstrip() + hint

    def paginate(self, path: str, query: Mapping[str, Any] | None = None, limit: int = 50) -> list[Any]:
        """Every item of a list endpoint, following Link rel=next (at most `limit` pages)."""
        items: list[Any] = []
        url: str | None = self._url(path, {**(query or {}), "per_page": 100})
        for _ in range(limit):
            if url is None:
                break
            _, page, link = self.request("GET", path, url=url)
            items += page or []
            match = re.search(r'<([^>]+)>;\s*rel="next"', link or "")
            url = match.group(1) if match and match.group(1).startswith(self.api_url.rstrip("/")) else None
        return items


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


# --------------------------------------------------------------------------- history


@dataclass
class HistoryUpdate:
    added: list[str] = field(default_factory=list)
    grown: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


class History:
    """The JSONL history: a checkout of the data branch (or a plain directory without remote).

    Authentication is an `http.extraheader` handed to git through GIT_CONFIG_* variables,
    so the token is on no command line and in no file; `actions/checkout` is not used
    for this branch because it may not exist yet (the first night creates it).
    """

    def __init__(self, path: Path, *, remote: str | None, branch: str = DATA_BRANCH, token: str | None = None,
                 log: Log = print) -> None:
        self.path = Path(path)
        self.remote = remote
        self.branch = branch
        self.token = token
        self.log = log

    @property
    def runs_dir(self) -> Path:
        return self.path / "runs"

    @property
    def bisect_dir(self) -> Path:
        return self.path / "bisect"

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        if self.token and self.remote and self.remote.startswith("https://"):
            basic = base64.b64encode(f"x-access-token:{self.token}".encode()).decode()
            count = int(env.get("GIT_CONFIG_COUNT", "0") or 0)
            env.update({"GIT_CONFIG_COUNT": str(count + 1), f"GIT_CONFIG_KEY_{count}": "http.extraheader",
                        f"GIT_CONFIG_VALUE_{count}": f"AUTHORIZATION: basic {basic}"})
        return env

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        name, email = GIT_IDENTITY
        cmd = ["git", "-c", f"user.name={name}", "-c", f"user.email={email}", "-c", "commit.gpgsign=false",
               "-C", str(self.path), *args]
        proc = subprocess.run(cmd, env=self._env(), capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise InfraError(f"git {' '.join(args[:2])} failed in {self.path} (exit {proc.returncode}): "
                             f"{proc.stderr.strip()[-500:]}")
        return proc

    def fetch(self) -> None:
        """Check out the branch's newest commit (depth 1), or start it when it does not exist."""
        self.path.mkdir(parents=True, exist_ok=True)
        if self.remote is None:
            return
        if not (self.path / ".git").exists():
            self.git("init", "-q")
            self.git("remote", "add", "origin", self.remote)
        probe = self.git("ls-remote", "--exit-code", "--heads", "origin", self.branch, check=False)
        if probe.returncode == 2:
            self.log(f"aggregate: branch {self.branch} does not exist yet; starting it")
            self.git("symbolic-ref", "HEAD", f"refs/heads/{self.branch}")
            return
        if probe.returncode != 0:
            raise InfraError(f"cannot read {self.branch} from the data remote: {probe.stderr.strip()[-300:]}")
        self.git("fetch", "-q", "--depth=1", "origin", f"+refs/heads/{self.branch}:refs/remotes/origin/{self.branch}")
        self.git("checkout", "-q", "-f", "-B", self.branch, f"origin/{self.branch}")
        self.git("clean", "-qfdx")

    def read(self, relpath: str) -> bytes | None:
        """One file of the branch's tip, fetching only that blob (a partial clone), or None."""
        if self.remote is None:
            path = self.path / relpath
            return path.read_bytes() if path.is_file() else None
        self.path.mkdir(parents=True, exist_ok=True)
        if not (self.path / ".git").exists():
            self.git("init", "-q")
            self.git("remote", "add", "origin", self.remote)
        ref = f"refs/remotes/origin/{self.branch}"
        fetched = self.git("fetch", "-q", "--depth=1", "--filter=blob:none", "origin",
                           f"+refs/heads/{self.branch}:{ref}", check=False)
        if fetched.returncode != 0:
            raise InfraError(f"cannot read {self.branch} from the data remote: {fetched.stderr.strip()[-300:]}")
        shown = subprocess.run(["git", "-C", str(self.path), "show", f"{ref}:{relpath}"], env=self._env(),
                               capture_output=True)
        return shown.stdout if shown.returncode == 0 else None

    def add_runs(self, run_dirs: Iterable[Path]) -> HistoryUpdate:
        """Copy run directories in; append-only, like the files themselves."""
        update = HistoryUpdate()
        for src in run_dirs:
            run_id = _run_id_of(src)
            dest = self.runs_dir / run_id
            new = (src / RESULTS_FILE).read_bytes() if (src / RESULTS_FILE).exists() else b""
            old = (dest / RESULTS_FILE).read_bytes() if (dest / RESULTS_FILE).exists() else None
            if old is not None and not new.startswith(old):
                update.refused.append(run_id)
                self.log(f"aggregate: refused {src}: its {RESULTS_FILE} rewrites the stored one of run {run_id}")
                continue
            state = "added" if old is None else ("unchanged" if old == new else "grown")
            dest.mkdir(parents=True, exist_ok=True)
            for name in RUN_FILES:
                if (src / name).exists():
                    shutil.copyfile(src / name, dest / name)
            getattr(update, state).append(run_id)
        return update

    def add_bisect(self, record: dict[str, Any]) -> Path:
        self.bisect_dir.mkdir(parents=True, exist_ok=True)
        key = _key(record["cell_id"], record["test_id"], record["axis"], record["good"], record["bad"])
        path = self.bisect_dir / f"{key}.json"  # a re-run of the same bisect replaces its record
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return path

    def publish(self, message: str, redo: Callable[[], Any]) -> bool:
        """Commit and push; on a rejected push, fetch the new tip, redo the writes, retry.

        Returns False when there was nothing to commit.
        """
        if self.remote is None:
            return False
        for attempt in range(PUSH_ATTEMPTS):
            readme = self.path / "README.md"
            if not readme.exists():
                readme.write_text(_DATA_README)
            self.git("add", "-A", ".")
            if self.git("diff", "--cached", "--quiet", check=False).returncode == 0:
                return False
            self.git("commit", "-q", "-m", message)
            pushed = self.git("push", "-q", "origin", f"HEAD:refs/heads/{self.branch}", check=False)
            if pushed.returncode == 0:
                return True
            self.log(f"aggregate: push to {self.branch} rejected (attempt {attempt + 1}); refetching")
            time.sleep(1 + attempt)
            self.fetch()
            redo()
        raise InfraError(f"could not push {self.branch} after {PUSH_ATTEMPTS} attempts: "
                         f"{pushed.stderr.strip()[-300:]}")


_DATA_README = """# distci-data

The history of distci's scheduled runs, written by the `aggregate` job of
.github/workflows/nightly.yml and the `record` job of bisect.yml. Nothing else writes here.

    runs/<run-id>/results.jsonl   one line per test outcome (the source of truth)
    runs/<run-id>/run.json        cell, tier, runner, image
    runs/<run-id>/stack.json      what the cell resolved to
    runs/<run-id>/junit.xml
    bisect/*.json                 bisect results (read by distci.store.read_bisect)

The SQLite store is an index over these files: `python -m distci ingest runs --bisect-dir bisect`.
"""


def _run_id_of(run_dir: Path) -> str:
    info = run_dir / RUN_FILE
    if info.exists():
        run_id = json.loads(info.read_text()).get("run_id")
        if run_id:
            return str(run_id)
    if (run_dir / RESULTS_FILE).exists():
        for line in (run_dir / RESULTS_FILE).read_text().splitlines():
            if line.strip():
                return str(json.loads(line)["run_id"])
    return run_dir.name


# --------------------------------------------------------------------------- missing cells


def expected_cells(matrix_json: Path) -> list[dict[str, Any]]:
    """The include entries of a `distci matrix --json` output."""
    data = json.loads(Path(matrix_json).read_text())
    return list(data.get("include", data) if isinstance(data, dict) else data)


def missing_cell_runs(expected: Sequence[Mapping[str, Any]], present: set[str], out: Path, *,
                      tier: str, reason: str) -> list[Path]:
    """An `infra` run for each expected cell that uploaded no run (rule 4: infra, never a pass).

    In Actions its id is made of the workflow run's id, so re-running the aggregate
    job does not add a second one.
    """
    made = []
    origin = f"gh{os.environ['GITHUB_RUN_ID']}" if os.environ.get("GITHUB_RUN_ID") else \
        time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for entry in expected:
        cell = str(entry["cell"])
        if cell in present:
            continue
        run_id = f"missing-{origin}-{cell}"
        run_dir = out / run_id
        stack = {"partial": True, "declared": dict(entry), "runner": ",".join(entry.get("runner", []))}
        RunDir(run_dir).append(Result(
            run_id=run_id, cell_id=cell, test_id=f"<infra>::{cell}", outcome="error", failure_kind="infra",
            error_signature=error_signature("MissingRun", "no results were uploaded for this cell"),
            message=f"no results were uploaded for this cell: {reason}", stack=stack,
            repro=f"nox -s dist_tests -- --cell {cell} --backend docker", started_at=_now(),
        ))
        (run_dir / RUN_FILE).write_text(json.dumps({
            "run_id": run_id, "cell_id": cell, "started_at": _now(), "ended_at": _now(), "tier": tier,
            "runner": stack["runner"], "backend": "docker"}, indent=1, sort_keys=True))
        made.append(run_dir)
    return made


# --------------------------------------------------------------------------- regressions


@dataclass(frozen=True)
class BisectPlan:
    """What bisect.yml is asked: the first bad point of one package between two stacks."""

    cell_id: str
    test_id: str
    axis: str
    good: str
    bad: str
    run_id: str = ""

    @property
    def key(self) -> str:
        """The question asked: the same range of one package in one cell (per issue, so per signature)."""
        return _key(self.cell_id, self.axis, self.good, self.bad)

    def inputs(self, issue: int) -> dict[str, str]:
        return {"test_id": self.test_id, "good": self.good, "bad": self.bad, "axis": self.axis,
                "cell": self.cell_id, "run": self.run_id, "issue": str(issue) if issue > 0 else ""}


def bisect_point(version: str) -> str:
    """A stack version as bisect takes it: a nightly's date, else the public version."""
    return nightly_date_of(version) or version.split("+", 1)[0]


def stack_changes(good: Mapping[str, Any], bad: Mapping[str, Any]) -> list[str]:
    """What differs between two stacks, as `key: old -> new` lines (environment keys only)."""
    lines = []
    for key in ENV_KEYS:
        if key == "packages":
            continue
        if good.get(key) != bad.get(key):
            lines.append(f"{key}: {good.get(key)} -> {bad.get(key)}")
    old, new = set(good.get("packages") or []), set(bad.get("packages") or [])
    if old != new:
        lines.append(f"packages: {len(new - old)} pins changed ({', '.join(sorted(new - old)[:5])})")
    return lines


@dataclass(frozen=True)
class Regression:
    """A result of tonight whose verdict is `regression`, with what the issue and bisect need."""

    cell_id: str
    run_id: str
    test_id: str
    signature: str
    reason: str
    excerpt: str
    repro: str
    compared_run: str | None
    good_stack: Mapping[str, Any]
    bad_stack: Mapping[str, Any]

    @property
    def key(self) -> str:
        return _key(self.signature)

    @property
    def occurrence(self) -> str:
        return _key(self.run_id, self.test_id)

    def bisect_plan(self) -> BisectPlan | None:
        for axis in BISECT_AXES:
            good, bad = self.good_stack.get(axis), self.bad_stack.get(axis)
            if good and bad and good != bad and bisect_point(str(good)) != bisect_point(str(bad)):
                return BisectPlan(self.cell_id, self.test_id, axis, bisect_point(str(good)), bisect_point(str(bad)),
                                  self.run_id)
        return None


def regressions(store: Store, run_ids: Iterable[str]) -> list[Regression]:
    """Tonight's regressions, in cell then test order."""
    found = []
    for run_id in sorted(set(run_ids)):
        run = store.run(run_id)
        if run is None:
            continue
        for r in store.results(run_id=run_id, verdicts=["regression"]):
            base = store.run(r.compared_run) if r.compared_run else None
            found.append(Regression(
                cell_id=r.cell_id, run_id=run_id, test_id=r.test_id,
                signature=r.error_signature or f"{r.failure_kind or r.outcome}: {r.test_id}",
                reason=r.verdict_reason, excerpt=r.excerpt, repro=r.repro, compared_run=r.compared_run,
                good_stack=base.stack if base else {}, bad_stack=run.stack,
            ))
    return sorted(found, key=lambda g: (g.cell_id, g.test_id, g.run_id))


# --------------------------------------------------------------------------- issue text


def _code(text: str) -> str:
    return "`" + str(text).replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"


def _occurrence_table(items: Sequence[Regression], run_url: str) -> str:
    rows = ["| cell | test | run | compared with | what changed |", "|---|---|---|---|---|"]
    for g in items:
        changes = "<br>".join(_code(c) for c in stack_changes(g.good_stack, g.bad_stack)[:6]) or "nothing recorded"
        run = f"[{_code(g.run_id)}]({run_url})" if run_url else _code(g.run_id)
        rows.append(f"| {_code(g.cell_id)} | {_code(g.test_id)} | {run} | {_code(g.compared_run or '-')} | {changes} |")
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
        f"**Reproduce** (from a checkout, on the cell's runner):\n\n~~~sh\n{first.repro}\n~~~",
        f"**Why it is a regression:** {first.reason}",
        "**Failure** (first occurrence):\n\n" + _excerpt_block(first.excerpt),
        "**Bisect:**\n\n" + "\n".join(f"- {n}" for n in bisect_notes),
        "\n".join([_marker("signature", first.key), *(_marker("occurrence", g.occurrence) for g in items)]),
    ]
    return _fit("\n\n".join(parts))


def occurrence_comment(items: Sequence[Regression], run_url: str, bisect_notes: Sequence[str], *,
                       again: bool) -> str:
    head = ("Regressed again (this issue was closed)." if again
            else f"Seen again: {len(items)} new occurrence{'s' if len(items) != 1 else ''}.")
    parts = [head, _occurrence_table(items, run_url)]
    if bisect_notes:
        parts.append("**Bisect:**\n\n" + "\n".join(f"- {n}" for n in bisect_notes))
    parts.append("\n".join(_marker("occurrence", g.occurrence) for g in items))
    return _fit("\n\n".join(parts))


def _fit(body: str) -> str:
    """GitHub refuses bodies over 65536 characters; the markers at the end must survive."""
    if len(body) <= MAX_BODY:
        return body
    tail_at = body.rfind("\n\n<!-- distci:")
    tail = body[tail_at:] if tail_at >= 0 else ""
    return body[: MAX_BODY - len(tail) - 40] + "\n\n(truncated)" + tail


# --------------------------------------------------------------------------- filing


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
        issue = existing.get(items[0].key)
        if issue is not None:
            tracker.load_comment_markers(issue)
        new = [g for g in items if issue is None or f"occurrence={g.occurrence}" not in issue.markers]
        plans = _bisect_plans(items, issue)
        chosen, budget = plans[:max(budget, 0)], budget - len(plans)
        notes = [f"{p.axis} {_code(p.good)} .. {_code(p.bad)} on {_code(p.cell_id)} for {_code(p.test_id)}: "
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
            tracker.comment(issue, f"Bisect dispatched: {plan.axis} {_code(plan.good)} .. {_code(plan.bad)} on "
                                   f"{_code(plan.cell_id)} for {_code(plan.test_id)}.\n\n{_marker('bisect', plan.key)}")
            report.bisects.append(plan.inputs(issue.number))
    return report


def _bisect_plans(items: Sequence[Regression], issue: Issue | None) -> list[BisectPlan]:
    """One plan per cell (from the first test that regressed there), unless already dispatched."""
    plans: list[BisectPlan] = []
    seen: set[str] = set()
    for g in items:
        plan = g.bisect_plan()
        if plan is None or plan.cell_id in seen:
            continue
        seen.add(plan.cell_id)
        if issue is None or f"bisect={plan.key}" not in issue.markers:
            plans.append(plan)
    return plans


# --------------------------------------------------------------------------- the aggregate


@dataclass
class AggregateReport:
    runs: list[str]
    history: HistoryUpdate
    regressions: list[dict[str, Any]]
    filing: FilingReport
    pushed: bool
    site: str | None
    missing: list[str]

    def to_markdown(self) -> str:
        lines = [
            "## distci aggregate",
            "",
            f"- runs: {len(self.runs)} ({len(self.history.added)} new to the history, "
            f"{len(self.history.refused)} refused), cells without results: {len(self.missing)}",
            f"- regressions: {len(self.regressions)}; issues opened {self.filing.opened or 'none'}, "
            f"updated {self.filing.updated or 'none'}; bisects dispatched: {len(self.filing.bisects)}",
        ]
        for r in self.regressions:
            lines.append(f"  - `{r['cell_id']}` :: `{r['test_id']}`: {r['signature']}")
        return "\n".join(lines) + "\n"


@dataclass
class AggregateOptions:
    artifacts: list[Path]
    data: Path
    data_remote: str | None = None
    data_branch: str = DATA_BRANCH
    store: Path = Path(".distci") / "aggregate" / "store.sqlite"
    site: Path | None = None
    expect: Path | None = None
    tier: str = "nightly"
    dry_run: bool = False
    issues: bool = True
    ref: str = "main"
    repo: str | None = None
    api_url: str | None = None
    max_bisects: int = 4
    title: str = "distci"
    report: Path | None = None


def aggregate(opts: AggregateOptions, *, log: Log = print) -> AggregateReport:
    """Tonight's artifacts -> history -> store -> regressions -> issues, bisects -> dashboard."""
    scratch = Path(tempfile.mkdtemp(prefix="distci-aggregate-"))
    try:
        run_dirs = find_run_dirs(opts.artifacts) if opts.artifacts else []
        missing: list[Path] = []
        if opts.expect is not None:
            reason = ("the runner died, timed out or the job was cancelled before the run started; "
                      f"see {workflow_run_url() or 'the workflow run'}")
            missing = missing_cell_runs(expected_cells(opts.expect), {_cell_of(d) for d in run_dirs}, scratch,
                                        tier=opts.tier, reason=reason)
        run_dirs += missing
        missing_cells = [_cell_of(d) for d in missing]
        tonight = [_run_id_of(d) for d in run_dirs]
        log(f"aggregate: {len(run_dirs)} runs in the artifacts, {len(missing)} cells without results")

        token = os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")
        history = History(opts.data, remote=opts.data_remote, branch=opts.data_branch, token=token, log=log)
        history.fetch()
        run_dirs = [d for d in run_dirs if d not in missing or not (history.runs_dir / d.name).exists()]
        update = history.add_runs(run_dirs)
        log(f"aggregate: history {history.path}: {len(update.added)} added, {len(update.grown)} grown, "
            f"{len(update.unchanged)} unchanged, {len(update.refused)} refused")
        found, site = _index(history, opts, tonight, log)

        pushed = False
        if opts.dry_run:
            log(f"aggregate: would push {len(update.added) + len(update.grown)} runs to {opts.data_branch}")
        else:
            pushed = history.publish(f"distci: {len(update.added)} runs ({workflow_run_url() or 'local'})",
                                     redo=lambda: history.add_runs(run_dirs))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    log(f"aggregate: {len(found)} regressions")
    filing = FilingReport()
    if opts.issues and found:
        filing = file_regressions(found, _tracker(opts.repo, opts.api_url, opts.dry_run, log), ref=opts.ref,
                                  run_url=workflow_run_url(), max_bisects=opts.max_bisects)
    report = AggregateReport(runs=tonight, history=update,
                             regressions=[{"cell_id": g.cell_id, "test_id": g.test_id, "run_id": g.run_id,
                                           "signature": g.signature} for g in found],
                             filing=filing, pushed=pushed, site=site, missing=missing_cells)
    if opts.report is not None:
        opts.report.parent.mkdir(parents=True, exist_ok=True)
        opts.report.write_text(json.dumps(asdict(report), indent=1, default=str) + "\n")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(report.to_markdown())
    return report


def _index(history: History, opts: AggregateOptions, tonight: list[str],
           log: Log) -> tuple[list[Regression], str | None]:
    """Index the whole history (verdicts need it), find tonight's regressions, render the dashboard."""
    with Store(opts.store) as store:
        if history.runs_dir.is_dir():
            try:
                log("aggregate: store: " + store.ingest([history.runs_dir]).summary())
            except StoreError as exc:
                log(f"aggregate: store: {exc}")
        if history.bisect_dir.is_dir():
            store.import_bisects(history.bisect_dir)
        found = regressions(store, tonight)
        if opts.site is None:
            return found, None
        from distci.dashboard import render_dashboard

        site = str(render_dashboard(store, opts.site, title=opts.title, audit_dir=None))
        log(f"aggregate: dashboard {site}")
        return found, site


def _tracker(repo: str | None, api_url: str | None, dry_run: bool, log: Log) -> Tracker:
    try:
        github: GitHub | None = GitHub.from_env(repo, api_url)
    except ConfigError:
        if not dry_run:
            raise
        log("aggregate: no GitHub token or repository: planning as if no issue existed")
        github = None
    return Tracker(github, dry_run=dry_run, log=log)


def _cell_of(run_dir: Path) -> str:
    info = run_dir / RUN_FILE
    if info.exists():
        cell = json.loads(info.read_text()).get("cell_id")
        if cell:
            return str(cell)
    for line in (run_dir / RESULTS_FILE).read_text().splitlines() if (run_dir / RESULTS_FILE).exists() else []:
        if line.strip():
            return str(json.loads(line)["cell_id"])
    return ""


# --------------------------------------------------------------------------- bisect results


def bisect_record(report_path: Path | None, *, test_id: str, axis: str, good: str, bad: str, cell_id: str,
                  run_url: str = "") -> dict[str, Any]:
    """The store's bisect record (store.read_bisect keys) of a bisect.yml run.

    A report of `distci bisect TEST_ID` carries that record at its top level (the
    narrowed good/bad and the culprit); it is kept, with the cell filled in. An older
    report without it, or no report at all (the bisect crashed, its runner died), is
    recorded from the question asked, with the status `error` when there is no report.
    """
    report: dict[str, Any] = {}
    if report_path is not None and Path(report_path).exists():
        report = json.loads(Path(report_path).read_text())
    if {"test_id", "axis", "good", "bad"} <= report.keys():
        record = dict(report)
        record["cell_id"] = record.get("cell_id") or cell_id
    else:
        first_bad = report.get("first_bad") if report.get("mode", "regression") == "regression" \
            else report.get("first_good")
        record = {**report, "test_id": test_id, "axis": axis, "good": good, "bad": bad, "cell_id": cell_id,
                  "culprit": first_bad, "status": report.get("kind", "error")}
    record["created_at"] = record.get("created_at") or _now()
    if run_url:
        record["report_path"] = run_url
    record["asked"] = {"test_id": test_id, "axis": axis, "good": good, "bad": bad, "cell_id": cell_id}
    return record


def record_bisect(record: dict[str, Any], *, data: Path, data_remote: str | None, data_branch: str = DATA_BRANCH,
                  store: Path, issue: int | None, dry_run: bool, repo: str | None = None,
                  api_url: str | None = None, log: Log = print) -> Path:
    """Add a bisect record to the history, index it, and tell its issue what was found."""
    token = os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN")
    history = History(data, remote=data_remote, branch=data_branch, token=token, log=log)
    history.fetch()
    path = history.add_bisect(record)
    with Store(store) as db:
        if not db.import_bisects(history.bisect_dir):
            raise StoreError("the bisect record was not indexed", where=str(path))
    if dry_run:
        log(f"aggregate: would push {path.name} to {data_branch}")
    else:
        history.publish(f"distci: bisect {record['axis']} {record['good']}..{record['bad']}",
                        redo=lambda: history.add_bisect(record))
    if issue:
        asked = record.get("asked", record)
        key = BisectPlan(asked["cell_id"], asked["test_id"], asked["axis"], asked["good"], asked["bad"]).key
        culprit = record.get("culprit")
        head = (f"Bisect of {record['axis']} {_code(asked['good'])} .. {_code(asked['bad'])} on "
                f"{_code(record['cell_id'])}: **{record.get('status') or 'done'}**")
        body = "\n\n".join(filter(None, [
            head + (f", first bad {_code(culprit)}" if culprit else ""),
            record.get("summary") and f"~~~text\n{record['summary']}\n~~~",
            record.get("report_path") and f"Report and logs: {record['report_path']}",
            _marker("bisect-result", key),
        ]))
        tracker = _tracker(repo, api_url, dry_run, log)
        target = Issue(issue, "open", "", "", set())
        tracker.load_comment_markers(target)
        if f"bisect-result={key}" not in target.markers:
            tracker.comment(target, body)
    return path


# --------------------------------------------------------------------------- cell lookup


def cell_outputs(cell_id: str, matrix_path: str | Path = "matrix.toml") -> dict[str, str]:
    """The runner labels and build facts of a cell, as `key=value` lines for $GITHUB_OUTPUT.

    bisect.yml runs on the runner the matrix declares for the cell; looking it up here
    keeps matrix.toml the only place runner labels are written.
    """
    from distci.matrix import load_matrix

    if any(c in cell_id for c in "*?["):
        raise SelectionError(f"a bisect runs on one cell; give its id, not a pattern: {cell_id!r}")
    cell = load_matrix(matrix_path).cell(cell_id)
    return {"cell": cell.id, "runner": json.dumps(list(cell.runner), separators=(",", ":")), "variant": cell.variant,
            "accelerator": cell.accelerator, "family": cell.family, "python": cell.python}


# --------------------------------------------------------------------------- CLI


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, default=Path(".distci") / "aggregate" / "data",
                   help="checkout of the history branch (made when missing)")
    p.add_argument("--data-remote", default=None,
                   help="git remote of the history (default: $GITHUB_SERVER_URL/$GITHUB_REPOSITORY.git in Actions, "
                        "else none: a plain local directory)")
    p.add_argument("--data-branch", default=DATA_BRANCH)
    p.add_argument("--store", type=Path, default=Path(".distci") / "aggregate" / "store.sqlite")
    p.add_argument("--repo", default=None, help="owner/name (default $GITHUB_REPOSITORY)")
    p.add_argument("--api-url", default=None, help=f"REST API root (default $GITHUB_API_URL or {DEFAULT_API_URL})")
    p.add_argument("--dry-run", action="store_true", help="write nothing to GitHub or the branch; print the plan")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="python -m distci.aggregate", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)

    p = sub.add_parser("nightly", help="aggregate a night's artifacts (the nightly.yml aggregate job)")
    p.add_argument("artifacts", nargs="*", type=Path, help="downloaded artifacts: run directories or parents of many")
    _common(p)
    p.add_argument("--site", type=Path, default=None, help="render the dashboard into this directory")
    p.add_argument("--expect", type=Path, default=None,
                   help="`distci matrix --json` output: cells without a run get an infra result")
    p.add_argument("--tier", default="nightly")
    p.add_argument("--ref", default=None, help="ref bisect.yml is dispatched on (default $GITHUB_REF_NAME or main)")
    p.add_argument("--no-issues", action="store_true", help="do not open issues or dispatch bisects")
    p.add_argument("--max-bisects", type=int, default=4, help="bisects dispatched per night at most (default 4)")
    p.add_argument("--report", type=Path, default=None, help="write the aggregate report as JSON here")
    p.add_argument("--title", default="distci")
    p.set_defaults(fn=_cmd_nightly)

    p = sub.add_parser("bisect-result", help="record a bisect report in the history and on its issue")
    p.add_argument("--report", type=Path, default=None, help="the bisect's report.json (missing: status error)")
    for name in ("test-id", "good", "bad", "axis", "cell"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--issue", default="", help="issue number to comment on (empty: none)")
    _common(p)
    p.set_defaults(fn=_cmd_bisect_result)

    p = sub.add_parser("stack", help="write a stored run's stack.json (the pins of a bisect) from the history")
    p.add_argument("run_id")
    p.add_argument("--out", type=Path, required=True)
    _common(p)
    p.set_defaults(fn=_cmd_stack)

    p = sub.add_parser("cell", help="print a cell's runner labels etc. as key=value lines (for $GITHUB_OUTPUT)")
    p.add_argument("cell")
    p.add_argument("--matrix", default="matrix.toml")
    p.set_defaults(fn=_cmd_cell)
    return parser


def _default_remote(arg: str | None) -> str | None:
    if arg:
        return arg
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    return f"{server}/{repo}.git" if server and repo else None


def _cmd_nightly(args: argparse.Namespace) -> int:
    opts = AggregateOptions(
        artifacts=list(args.artifacts), data=args.data, data_remote=_default_remote(args.data_remote),
        data_branch=args.data_branch, store=args.store, site=args.site, expect=args.expect, tier=args.tier,
        dry_run=args.dry_run, issues=not args.no_issues, ref=args.ref or os.environ.get("GITHUB_REF_NAME") or "main",
        repo=args.repo, api_url=args.api_url, max_bisects=args.max_bisects, title=args.title, report=args.report,
    )
    aggregate(opts)
    return 0


def _cmd_bisect_result(args: argparse.Namespace) -> int:
    record = bisect_record(args.report, test_id=args.test_id, axis=args.axis, good=args.good, bad=args.bad,
                           cell_id=args.cell, run_url=workflow_run_url())
    issue = int(args.issue) if str(args.issue).strip().isdigit() else None
    path = record_bisect(record, data=args.data, data_remote=_default_remote(args.data_remote),
                         data_branch=args.data_branch, store=args.store, issue=issue, dry_run=args.dry_run,
                         repo=args.repo, api_url=args.api_url)
    print(f"aggregate: bisect {record['status']}: {path}")
    return 0


def _cmd_stack(args: argparse.Namespace) -> int:
    if not re.fullmatch(r"[\w.+-]+", args.run_id):
        raise SelectionError(f"not a run id: {args.run_id!r}")
    history = History(args.data, remote=_default_remote(args.data_remote), branch=args.data_branch,
                      token=os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN"))
    data = history.read(f"runs/{args.run_id}/{STACK_FILE}")
    if data is None:
        raise SelectionError(f"run {args.run_id} has no {STACK_FILE} in the history ({args.data_branch})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"aggregate: {args.out}")
    return 0


def _cmd_cell(args: argparse.Namespace) -> int:
    for key, value in cell_outputs(args.cell, args.matrix).items():
        print(f"{key}={value}")
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Registers `aggregate` on the distci CLI (`python -m distci aggregate nightly ...`)."""
    p = sub.add_parser("aggregate", help="the CI aggregate: history, store, issues, bisects, dashboard")
    build_parser(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except DistciError as exc:
        print(f"distci aggregate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
