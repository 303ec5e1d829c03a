"""The nightly aggregate, run locally: history branch, store, verdicts, issues, bisects, dashboard.

GitHub is a small fake REST server on 127.0.0.1 (the endpoints distci.ci uses,
with GitHub's pagination and auth behaviour); the history branch lives in a bare git
repository in tmp_path. The first test aggregates the artifacts of two real cell runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from conftest import REPO
from distci.ci.history import History
from distci.ci.nightly import AggregateOptions, aggregate, bisect_record, record_bisect
from distci.errors import ConfigError
from distci.results import Result
from distci.rundir import RunDir
from distci.judge.store import Store

DEFAULT_CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
TOKEN = "test-token-not-a-secret"
REPO_SLUG = "distci/distci"


# --------------------------------------------------------------------------- fake GitHub


class FakeGitHub:
    """The REST endpoints the aggregate uses, with GitHub's shapes.

    Pages hold at most `page_size` items whatever per_page asks, so the client's
    Link-following is exercised with a handful of issues. `read_only` answers writes
    like a token without `issues: write`.
    """

    def __init__(self, page_size: int = 2) -> None:
        self.issues: list[dict[str, Any]] = []
        self.comments: dict[int, list[dict[str, Any]]] = {}
        self.labels: set[str] = set()
        self.dispatches: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.page_size = page_size
        self.read_only = False
        self.rate_limited_writes = 0  # the next N writes get GitHub's secondary-rate-limit 403
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any = None, link: str = "", retry_after: str = "") -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                if retry_after:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if link:
                    self.send_header("Link", link)
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                fake.requests.append((method, self.path))
                if self.headers.get("Authorization") not in (f"Bearer {TOKEN}", f"token {TOKEN}"):
                    return self._send(401, {"message": "Bad credentials"})
                if self.command != "GET" and fake.rate_limited_writes > 0:
                    fake.rate_limited_writes -= 1
                    return self._send(403, {"message": "You have exceeded a secondary rate limit. Please wait "
                                                       "a few minutes before you try again."}, retry_after="1")
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                url = urlparse(self.path)
                status, payload, link = fake.route(method, url.path, parse_qs(url.query), body,
                                                   f"http://{self.headers['Host']}")
                self._send(status, payload, link)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PATCH(self) -> None:
                self._handle("PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    def _page(self, items: list[Any], query: dict[str, list[str]], base: str, path: str) -> tuple[list[Any], str]:
        size = min(int(query.get("per_page", ["30"])[0]), self.page_size)
        page = int(query.get("page", ["1"])[0])
        chunk = items[(page - 1) * size: page * size]
        link = ""
        if page * size < len(items):
            rest = {k: v[0] for k, v in query.items() if k != "page"}
            qs = "&".join(f"{k}={v}" for k, v in rest.items())
            link = f'<{base}{path}?{qs}&page={page + 1}>; rel="next"'
        return chunk, link

    def route(self, method: str, path: str, query: dict[str, list[str]], body: Any,
              base: str) -> tuple[int, Any, str]:
        prefix = f"/repos/{REPO_SLUG}"
        if not path.startswith(prefix):
            return 404, {"message": "Not Found"}, ""
        path = path[len(prefix):]
        if method != "GET" and self.read_only:
            return 403, {"message": "Resource not accessible by integration"}, ""
        if m := re.fullmatch(r"/labels/([\w-]+)", path):
            return (200, {"name": m.group(1)}, "") if m.group(1) in self.labels else (404, {"message": "Not Found"}, "")
        if path == "/labels" and method == "POST":
            self.labels.add(body["name"])
            return 201, {"name": body["name"]}, ""
        if path == "/issues" and method == "GET":
            label = query.get("labels", [""])[0]
            state = query.get("state", ["open"])[0]
            items = [i for i in self.issues
                     if (not label or label in [x["name"] for x in i["labels"]]) and state in ("all", i["state"])]
            chunk, link = self._page(items, query, base, prefix + path)
            return 200, chunk, link
        if path == "/issues" and method == "POST":
            number = len(self.issues) + 1
            issue = {"number": number, "state": "open", "title": body["title"], "body": body["body"],
                     "labels": [{"name": n} for n in body.get("labels", [])],
                     "html_url": f"https://example.invalid/issues/{number}"}
            self.issues.append(issue)
            return 201, issue, ""
        if m := re.fullmatch(r"/issues/(\d+)", path):
            issue = self.issues[int(m.group(1)) - 1]
            if method == "PATCH":
                issue.update(body)
            return 200, issue, ""
        if m := re.fullmatch(r"/issues/(\d+)/comments", path):
            comments = self.comments.setdefault(int(m.group(1)), [])
            if method == "POST":
                comments.append({"id": len(comments) + 1, "body": body["body"]})
                return 201, comments[-1], ""
            chunk, link = self._page(comments, query, base, prefix + path)
            return 200, chunk, link
        if m := re.fullmatch(r"/actions/workflows/([\w.-]+)/dispatches", path):
            self.dispatches.append({"workflow": m.group(1), **body})
            return 204, None, ""
        return 404, {"message": "Not Found"}, ""

    def writes(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[0] != "GET"]


@pytest.fixture
def github(monkeypatch, tmp_path):
    fake = FakeGitHub()
    # Unrelated traffic the dedup must ignore: a pull request and an issue without the label.
    fake.issues.append({"number": 1, "state": "open", "title": "a PR", "body": "<!-- distci:signature=0 -->",
                        "labels": [{"name": "distci-regression"}], "pull_request": {}, "html_url": ""})
    fake.issues.append({"number": 2, "state": "open", "title": "hello", "body": "", "labels": [], "html_url": ""})
    fake.thread.start()
    for var in ("GITHUB_SERVER_URL", "GITHUB_RUN_ID", "GITHUB_REF_NAME", "GH_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GITHUB_API_URL", fake.url)
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("DISTCI_GITHUB_WRITE_INTERVAL", "0")
    monkeypatch.setenv("GITHUB_REPOSITORY", REPO_SLUG)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def distci_issues(fake: FakeGitHub) -> list[dict[str, Any]]:
    return [i for i in fake.issues if "pull_request" not in i and i["labels"]]


def bare_remote(tmp_path: Path) -> str:
    remote = tmp_path / "origin.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    return str(remote)


def remote_files(remote: str, branch: str = "distci-data") -> list[str]:
    out = subprocess.run(["git", "--git-dir", remote, "ls-tree", "-r", "--name-only", branch],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def options(tmp_path: Path, night: str, artifacts: Path, remote: str, **kw: Any) -> AggregateOptions:
    """A fresh checkout and a fresh store for every aggregate, as on a hosted runner."""
    kw.setdefault("site", tmp_path / f"site-{night}")
    return AggregateOptions(artifacts=[artifacts], data=tmp_path / f"data-{night}", data_remote=remote,
                            store=tmp_path / f"store-{night}.sqlite", **kw)


# --------------------------------------------------------------------------- real runs

FLIP_SUITE = '''
import os


def test_stable():
    assert sum(range(4)) == 6


def test_flips():
    if os.environ.get("DISTCI_TEST_FLIP") == "broken":
        raise RuntimeError("the optimizer step diverged at step 3 (loss=inf)")
'''


def real_run(tmp_path: Path, night: str, *, broken: bool) -> Path:
    """One real cell run into an artifacts directory laid out as download-artifact leaves it.

    The image digest changes between nights like a rebuilt image would, so the flip is
    a change of environment (a regression), not flakiness in one environment.
    """
    suite = tmp_path / "suite" / "test_flip.py"
    suite.parent.mkdir(exist_ok=True)
    suite.write_text(FLIP_SUITE)
    artifacts = tmp_path / f"artifacts-{night}"
    env = {**_clean_env(), "DISTCI_IMAGE_DIGEST": f"sha256:{night * 8}", "DISTCI_TEST_FLIP": "broken" if broken else ""}
    proc = subprocess.run(
        [sys.executable, "-m", "distci", "run", "--cell", DEFAULT_CELL, "--tier", "nightly", "--test", str(suite),
         "--runs-root", str(artifacts / f"run-{DEFAULT_CELL}")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == (1 if broken else 0), proc.stdout[-3000:] + proc.stderr[-2000:]
    return artifacts


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "DISTCI_TEST_FLIP"))}


@pytest.mark.slow
def test_two_real_nights_file_one_issue_once(tmp_path, github):
    night1 = real_run(tmp_path, "a", broken=False)
    night2 = real_run(tmp_path, "b", broken=True)
    remote = bare_remote(tmp_path)
    expect = tmp_path / "matrix.json"
    expect.write_text(json.dumps({"include": [
        {"cell": DEFAULT_CELL, "runner": ["ubuntu-latest"]},
        {"cell": DEFAULT_CELL.replace("fix_on", "fix_off"), "runner": ["ubuntu-latest"]},
    ]}))

    first = aggregate(options(tmp_path, "1", night1, remote, expect=expect))
    assert len(first.history.added) == 2 and first.missing == [DEFAULT_CELL.replace("fix_on", "fix_off")]
    assert first.regressions == [] and first.pushed
    assert sum(f.endswith("results.jsonl") for f in remote_files(remote)) == 2
    assert distci_issues(github) == []

    # A dry run of night 2 plans the issue and writes nothing anywhere.
    lines: list[str] = []
    dry = aggregate(options(tmp_path, "dry", night2, remote, dry_run=True), log=lines.append)
    assert any("would open issue" in line for line in lines)
    assert github.writes() == [] and not dry.pushed
    assert sum(f.endswith("results.jsonl") for f in remote_files(remote)) == 2

    second = aggregate(options(tmp_path, "2", night2, remote))
    (reg,) = second.regressions
    assert reg["test_id"].endswith("test_flip.py::test_flips")
    assert reg["signature"] == "RuntimeError: the optimizer step diverged at step N (loss=inf)"
    (issue,) = distci_issues(github)
    assert second.filing.opened == [issue["number"]]
    assert issue["labels"] == [{"name": "distci-regression"}] and "distci-regression" in github.labels
    assert issue["title"] == f"[distci] regression: {reg['signature']}"
    assert reg["signature"] in issue["body"] and "<!-- distci:signature=" in issue["body"]
    assert "image_digest: sha256:aaaaaaaa -> sha256:bbbbbbbb" in issue["body"]
    assert "not dispatched: no package version differs" in issue["body"]
    assert github.dispatches == []

    with Store(tmp_path / "store-2.sqlite") as store:
        assert len(store.runs(cell_id=DEFAULT_CELL)) == 2
        verdicts = {(r.run_id == reg["run_id"], r.test_id.rsplit("::", 1)[1]): r.verdict
                    for r in store.results(cell_id=DEFAULT_CELL)}
        assert verdicts == {(False, "test_stable"): "pass", (False, "test_flips"): "pass",
                            (True, "test_stable"): "pass", (True, "test_flips"): "regression"}
        (infra,) = store.results(cell_id=DEFAULT_CELL.replace("fix_on", "fix_off"))
        assert infra.verdict == "infra"
    page = (tmp_path / "site-2" / "index.html").read_text()
    assert "test_flips" in page and DEFAULT_CELL in page
    assert "regressions: 1" in (tmp_path / "summary.md").read_text()

    # The same artifacts again (a re-run job): nothing new is written to GitHub or the branch.
    before = github.writes()
    third = aggregate(options(tmp_path, "3", night2, remote))
    assert len(third.regressions) == 1
    assert third.filing.opened == [] and third.filing.unchanged == [issue["number"]]
    assert github.writes() == before and len(distci_issues(github)) == 1
    assert third.history.unchanged == [reg["run_id"]] and not third.pushed


# --------------------------------------------------------------------------- synthetic nights


def write_run(root: Path, cell: str, night: str, torch: str, outcomes: dict[str, str]) -> Path:
    """A run directory as a cell job uploads it (the JSONL contract of distci.results)."""
    run_id = f"{night.replace('-', '')}T011700Z-000000-{cell}"
    run_dir = root / f"run-{cell}" / run_id
    stack = {"torch": torch, "torchao": "0.19.0", "python": "3.11.7", "device_name": "H200"}
    writer = RunDir(run_dir)
    for test, outcome in outcomes.items():
        failed = outcome == "failed"
        writer.append(Result(
            run_id=run_id, cell_id=cell, test_id=f"suites/test_tp.py::{test}", outcome=outcome, stack=stack,
            failure_kind="exception" if failed else None,
            error_signature="RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:N, unhandled cuda error" if failed
            else None,
            message="RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1971, unhandled cuda error" if failed else "",
            repro=f"nox -s dist_tests -- --cell {cell} --test suites/test_tp.py::{test}",
            started_at=f"{night}T01:17:00+00:00",
        ))
    (run_dir / "stack.json").write_text(json.dumps(stack))
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_id, "cell_id": cell, "tier": "nightly",
                                                  "started_at": f"{night}T01:17:00+00:00"}))
    return run_dir


CELL_A = "cuda-cu130-torch_nightly-ao_nightly-ws2-fix_on"
CELL_B = "cuda-cu130-torch_nightly-ao_nightly-ws4-fix_on"
CELL_C = "cuda-cu130-torch_nightly-ao_nightly-ws8-fix_on"


def nightly(night: str) -> str:
    return f"2.15.0.dev{night.replace('-', '')}+cu130"


def test_one_issue_per_signature_across_cells_and_nights(tmp_path, github):
    remote = bare_remote(tmp_path)
    green = {"test_tp_loss": "passed", "test_tp_grads": "passed"}
    red = {"test_tp_loss": "failed", "test_tp_grads": "failed"}
    nights = {
        "2026-11-19": {CELL_A: green, CELL_B: green, CELL_C: green},
        "2026-11-20": {CELL_A: red, CELL_B: red, CELL_C: green},
        "2026-11-21": {CELL_A: red, CELL_B: red, CELL_C: red},
    }
    reports = {}
    for night, cells in nights.items():
        artifacts = tmp_path / f"artifacts-{night}"
        for cell, outcomes in cells.items():
            write_run(artifacts, cell, night, nightly(night), outcomes)
        reports[night] = aggregate(options(tmp_path, night, artifacts, remote, site=None))
        if night == "2026-11-20":
            (issue,) = distci_issues(github)
            issue["state"] = "closed"  # someone closed it; the next regression must reopen it

    assert reports["2026-11-19"].regressions == []
    second = reports["2026-11-20"]
    assert len(second.regressions) == 4 and len(second.filing.opened) == 1
    # One bisect per regressed cell, on the package whose version changed.
    assert sorted((d["inputs"]["cell"], d["inputs"]["axis"], d["inputs"]["good"], d["inputs"]["bad"])
                  for d in github.dispatches[:2]) == [
        (CELL_A, "torch", "2026-11-19", "2026-11-20"), (CELL_B, "torch", "2026-11-19", "2026-11-20")]
    (issue,) = distci_issues(github)
    assert all(d["workflow"] == "bisect.yml" and d["ref"] == "main" and d["inputs"]["issue"] == str(issue["number"])
               for d in github.dispatches)
    # The bisect job pins the other packages to the red run's stack, read back from the history.
    red_run = github.dispatches[0]["inputs"]["run"]
    assert red_run.startswith("20261120T011700Z")
    pins = History(tmp_path / "pins", remote=remote).read(f"runs/{red_run}/stack.json")
    assert json.loads(pins)["torch"] == nightly("2026-11-20")
    assert issue["body"].count("<!-- distci:occurrence=") == 4

    # Night 3: A and B fail again (`fail`, not new); C regresses with the same signature.
    third = reports["2026-11-21"]
    assert [(r["cell_id"], r["test_id"]) for r in third.regressions] == [
        (CELL_C, "suites/test_tp.py::test_tp_grads"), (CELL_C, "suites/test_tp.py::test_tp_loss")]
    assert third.filing.opened == [] and third.filing.updated == [issue["number"]]
    assert issue["state"] == "open" and len(distci_issues(github)) == 1
    bodies = [c["body"] for c in github.comments[issue["number"]]]
    assert sum(b.startswith("Regressed again") for b in bodies) == 1
    assert sum(b.startswith("Bisect dispatched") for b in bodies) == 3
    assert len(github.dispatches) == 3 and github.dispatches[2]["inputs"]["cell"] == CELL_C

    # Re-running night 3 from scratch writes nothing.
    before = github.writes()
    again = aggregate(options(tmp_path, "rerun", tmp_path / "artifacts-2026-11-21", remote, site=None))
    assert len(again.regressions) == 2 and github.writes() == before
    assert sum(f.endswith("results.jsonl") for f in remote_files(remote)) == 9


def test_a_secondary_rate_limit_is_waited_out_and_the_issue_opened_once(tmp_path, github):
    """GitHub answers bursts of writes with 403 + Retry-After; the client waits and retries."""
    remote = bare_remote(tmp_path)
    a, b = tmp_path / "artifacts-a", tmp_path / "artifacts-b"
    write_run(a, CELL_A, "2026-11-19", nightly("2026-11-19"), {"test_tp_loss": "passed"})
    write_run(b, CELL_A, "2026-11-20", nightly("2026-11-20"), {"test_tp_loss": "failed"})
    aggregate(options(tmp_path, "a", a, remote, site=None))
    github.labels.add("distci-regression")
    github.rate_limited_writes = 2
    report = aggregate(options(tmp_path, "b", b, remote, site=None))
    assert github.rate_limited_writes == 0
    assert report.filing.opened and len(distci_issues(github)) == 1
    posts = [r for r in github.requests if r == ("POST", f"/repos/{REPO_SLUG}/issues")]
    assert len(posts) == 3  # two refused with 403, the third created it


def test_missing_permission_is_one_line_that_names_it(tmp_path, github):
    remote = bare_remote(tmp_path)
    a = tmp_path / "artifacts-a"
    b = tmp_path / "artifacts-b"
    write_run(a, CELL_A, "2026-11-19", nightly("2026-11-19"), {"test_tp_loss": "passed"})
    write_run(b, CELL_A, "2026-11-20", nightly("2026-11-20"), {"test_tp_loss": "failed"})
    aggregate(options(tmp_path, "a", a, remote, site=None))
    github.labels.add("distci-regression")
    github.read_only = True
    with pytest.raises(ConfigError, match=r"POST /repos/distci/distci/issues: HTTP 403 .*permissions: issues: write"):
        aggregate(options(tmp_path, "b", b, remote, site=None))
    assert TOKEN not in str(github.requests)


@pytest.mark.parametrize("with_record", [True, False], ids=["report-with-store-record", "bare-report"])
def test_bisect_result_is_recorded_indexed_and_reported_once(tmp_path, github, with_record):
    remote = bare_remote(tmp_path)
    report = tmp_path / "report.json"
    data = {"version": 1, "kind": "boundary", "mode": "regression",
            "summary": "first bad: 2026-11-20 (last good 2026-11-19)",
            "last_good": "2026-11-19", "first_bad": "2026-11-20"}
    if with_record:  # what `distci bisect TEST_ID` writes at the top of its report
        data.update(test_id="suites/test_tp.py::test_tp_loss", axis="torch-nightly", good="2026-11-19",
                    bad="2026-11-20", culprit="2026-11-20", cell_id="", status="boundary")
    report.write_text(json.dumps(data))
    github.issues.append({"number": 3, "state": "open", "title": "r", "body": "", "labels": [], "html_url": ""})
    record = bisect_record(report, test_id="suites/test_tp.py::test_tp_loss", axis="torch", good="2026-11-18",
                           bad="2026-11-20", cell_id=CELL_A)
    for attempt in range(2):  # a re-run of the record job
        record_bisect(record, data=tmp_path / f"data-{attempt}", data_remote=remote, store=tmp_path / "s.sqlite",
                      issue=3, dry_run=False)
    with Store(tmp_path / "s.sqlite") as store:
        (row,) = store.bisects()
    assert (row.cell_id, row.culprit, row.status) == (CELL_A, "2026-11-20", "boundary")
    assert (row.good, row.bad) == (("2026-11-19", "2026-11-20") if with_record else ("2026-11-18", "2026-11-20"))
    (comment,) = github.comments[3]
    assert "first bad `2026-11-20`" in comment["body"] and "`2026-11-18` .. `2026-11-20`" in comment["body"]
    (stored,) = [f for f in remote_files(remote) if f.startswith("bisect/")]
    assert json.loads(subprocess.run(["git", "--git-dir", remote, "show", f"distci-data:{stored}"], check=True,
                                     capture_output=True, text=True).stdout)["culprit"] == "2026-11-20"


def test_a_bisect_that_left_no_report_is_recorded_as_error(tmp_path, github):
    record = bisect_record(tmp_path / "missing.json", test_id="suites/test_tp.py::t", axis="torch",
                           good="2.13.0", bad="2.14.1", cell_id=CELL_A)
    record_bisect(record, data=tmp_path / "data", data_remote=None, store=tmp_path / "s.sqlite", issue=None,
                  dry_run=False)
    with Store(tmp_path / "s.sqlite") as store:
        (row,) = store.bisects()
    assert (row.status, row.culprit, row.good, row.bad) == ("error", None, "2.13.0", "2.14.1")
    assert github.writes() == []


def test_concurrent_pushes_to_the_history_both_land(tmp_path):
    remote = bare_remote(tmp_path)
    runs = tmp_path / "runs"
    one = write_run(runs, CELL_A, "2026-11-19", nightly("2026-11-19"), {"test_tp_loss": "passed"})
    two = write_run(runs, CELL_B, "2026-11-19", nightly("2026-11-19"), {"test_tp_loss": "passed"})
    first = History(tmp_path / "h1", remote=remote, log=lambda _: None)
    second = History(tmp_path / "h2", remote=remote, log=lambda _: None)
    first.fetch()
    second.fetch()
    second.add_runs([two])
    assert second.publish("second", redo=lambda: second.add_runs([two]))
    first.add_runs([one])
    assert first.publish("first", redo=lambda: first.add_runs([one]))  # rejected once, refetched, redone
    assert sorted(f.split("/")[1] for f in remote_files(remote) if f.endswith("results.jsonl")) == sorted(
        [one.name, two.name])
