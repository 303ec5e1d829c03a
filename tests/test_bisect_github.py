"""bisect's GitHub reads through the project's one client (distci.provision.github),
against a local fake of the REST API: the pull requests touching the lines python-diff
found, and the main commits below two nightlies when there is no pytorch clone.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from distci.bisect.below import _from_api
from distci.bisect.engine import BisectResult
from distci.bisect.hunks import Hunk
from distci.bisect.upstream import git_version, pointer_upstream

GOOD_GIT, BAD_GIT = "1" * 40, "2" * 40
REPO = "/repos/pytorch/pytorch"


class _FakeGitHub(BaseHTTPRequestHandler):
    routes: dict[str, object] = {}
    seen: list[str] = []
    auth: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(self.path.split("?")[0])
        self.auth.append(self.headers.get("Authorization", ""))
        body = self.routes.get(self.path.split("?")[0])
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body if body is not None else {"message": "Not Found"}).encode())

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def github():
    _FakeGitHub.seen, _FakeGitHub.auth = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeGitHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_pull_requests_touching_the_lines_come_from_the_github_client(tmp_path, github):
    for name, git in (("good", GOOD_GIT), ("bad", BAD_GIT)):
        (tmp_path / name / "torch").mkdir(parents=True)
        (tmp_path / name / "torch" / "version.py").write_text(f"git_version = '{git}'\n")
    assert git_version(tmp_path / "good") == GOOD_GIT
    repo = REPO
    _FakeGitHub.routes = {
        f"{repo}/compare/{GOOD_GIT}...{BAD_GIT}": {"commits": [{"sha": "a" * 40}, {"sha": "b" * 40}, {"sha": "c" * 40}]},
        f"{repo}/commits/{'a' * 40}": {"files": [{"filename": "torch/other.py", "patch": "+    return 2 * x"}]},
        f"{repo}/commits/{'b' * 40}": {"files": [{"filename": "torch/ops.py", "patch": "@@ -8 +8 @@\n-    return 2 * x\n+    return x + x + (x == 3)"}]},
        f"{repo}/commits/{'c' * 40}": {"files": [{"filename": "torch/ops.py", "patch": "+# unrelated\n"}]},
        f"{repo}/commits/{'b' * 40}/pulls": [{"number": 4242, "title": "scale: faster", "merged_at": "2026-11-01T00:00:00Z",
                                             "html_url": "https://github.com/pytorch/pytorch/pull/4242"},
                                            {"number": 4243, "title": "not merged", "merged_at": None, "html_url": ""}],
    }
    hunk = Hunk("torch/ops.py", 7, 8, ("    return 2 * x\n",), ("    return x + x + (x == 3)\n",))
    pointer = pointer_upstream(tmp_path / "good", tmp_path / "bad", [hunk], log=lambda line: None,
                               environ={"GITHUB_TOKEN": "t0ken", "DISTCI_GITHUB_API": github})
    without = pointer_upstream(tmp_path / "good", tmp_path / "bad", [hunk], environ={}, log=lambda line: None)
    assert set(_FakeGitHub.auth) == {"token t0ken"}
    assert [(p.number, p.title, p.commit) for p in pointer.pulls] == [(4242, "scale: faster", "b" * 40)]
    assert f"{repo}/commits/{'c' * 40}/pulls" not in _FakeGitHub.seen  # its patch misses the lines
    assert "pull request #4242: scale: faster" in "\n".join(pointer.lines())
    assert without.pulls == [] and "set GITHUB_TOKEN" in without.pulls_note
    assert without.compare == f"https://github.com/pytorch/pytorch/compare/{GOOD_GIT}...{BAD_GIT}"


def test_below_the_nightly_without_a_clone_lists_the_range_through_the_github_client(github, monkeypatch):
    monkeypatch.setenv("DISTCI_GITHUB_API", github)
    monkeypatch.setenv("GITHUB_TOKEN", "never-sent-to-a-mirror")
    g_night, b_night, g_main, b_main = "a" * 40, "b" * 40, "c" * 40, "d" * 40
    _FakeGitHub.routes = {
        f"{REPO}/commits/{g_night}": {"commit": {"message": f"2026-11-19 nightly release ({g_main})"}},
        f"{REPO}/commits/{b_night}": {"commit": {"message": f"2026-11-20 nightly release ({b_main})"}},
        f"{REPO}/compare/{g_main}...{b_main}": {"commits": [
            {"sha": "e" * 40, "commit": {"message": "docs: typo"}},
            {"sha": "f" * 40, "commit": {"message": "[dtensor] redistribute: keep the placement\n\nbody"}}]},
        f"{REPO}/commits/{'e' * 40}": {"files": [{"filename": "docs/source/index.rst"}]},
        f"{REPO}/commits/{'f' * 40}": {"files": [{"filename": "torch/distributed/tensor/_redistribute.py"}]},
    }
    result = BisectResult(kind="boundary", mode="regression", candidates=2)
    section = _from_api({"last_old": g_night, "first_new": b_night}, result, lambda line: None)
    assert section["status"] == "listed" and (section["good_main"], section["bad_main"]) == (g_main, b_main)
    assert section["commits"] == 2
    assert section["compare"] == f"https://github.com/pytorch/pytorch/compare/{g_main}...{b_main}"
    assert section["native"] == [] and sorted(s["commit"] for s in section["suspects"]) == ["e" * 40, "f" * 40]
    assert f"{REPO}/commits/{'f' * 40}" in _FakeGitHub.seen  # each commit's files were read
    assert set(_FakeGitHub.auth) == {""}  # the token goes to GitHub only, never to another API root
