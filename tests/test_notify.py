"""Webhook notifications, delivered to a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Iterator

import pytest
from conftest import REPO
from fixtures_dashboard import MATRIX, TP, _cells
from fixtures_runs import write_run

from distci.errors import ConfigError, InfraError
from distci.publish.notify import WebhookConfig, notify, post
from distci.judge.store import Store
from distci.judge.ingest import ingest_runs

SIG = "AssertionError: loss differs by N"


class _Hook(BaseHTTPRequestHandler):
    received: list[tuple[str, dict]] = []
    status = 200
    failures: list[int] = []  # statuses to answer first, one per request, before `status`

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.headers["Content-Type"], json.loads(body)))
        self.send_response(type(self).failures.pop(0) if type(self).failures else type(self).status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"received": [], "status": 200, "failures": []})
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """Two nights of the release cell (the second regresses after a triton update) and the PR cell."""
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(MATRIX)
    cells = _cells(matrix)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    for n, (triton, outcome) in enumerate((("3.5.0", "passed"), ("3.5.1", "failed"))):
        rows = [{"test_id": TP[0]}, {"test_id": TP[1], "outcome": outcome,
                                     **({"failure_kind": "assert", "error_signature": SIG} if outcome == "failed" else {})}]
        for cell in (cells["release_red"], cells["twin_on"]):
            write_run(tmp_path / "runs", f"n{n}-{cell}", cell, rows if cell == cells["release_red"] else rows[:1],
                      started_at=now - timedelta(hours=30 - 12 * n), stack={"torch": "2.14.1", "triton": triton})
    db = tmp_path / "store.sqlite"
    with Store(db) as s:
        ingest_runs(s, [tmp_path / "runs"])
    return db, matrix, cells


def test_regressions_and_a_blocked_gate_reach_the_webhook(hook, store) -> None:
    url, handler = hook
    db, matrix, cells = store
    config = WebhookConfig.from_env({"DISTCI_WEBHOOK_URL": url, "DISTCI_DASHBOARD_URL": "https://ci.example/site/"})
    with Store(db) as s:
        sent = notify(s, config, tiers=["release", "pr"], matrix_path=matrix)
    assert [m for _, m in handler.received] == sent and {c for c, _ in handler.received} == {"application/json"}
    regressions, release = sent
    assert regressions["text"] == "distci: 1 new regression in 1 cell (1 signature)"
    assert SIG in regressions["blocks"][1]["text"]["text"] and cells["release_red"] in regressions["blocks"][1]["text"]["text"]
    assert "<https://ci.example/site/|dashboard>" in regressions["blocks"][1]["text"]["text"]
    assert release["text"] == "distci gate BLOCKED for tier release"
    detail = release["blocks"][1]["text"]["text"]
    assert f"blocking: `{TP[1]}` in {cells['release_red']}" in detail
    assert f"{cells['stale']} is missing" in detail, "the release tier expects a cell that never ran"
    assert all(set(b) == {"type", "text"} and b["text"]["type"] == "mrkdwn" for m in sent for b in m["blocks"])


def test_events_select_what_is_sent(hook, store) -> None:
    url, handler = hook
    db, matrix, _ = store
    with Store(db) as s:
        sent = notify(s, WebhookConfig.from_env({"DISTCI_WEBHOOK_URL": url, "DISTCI_WEBHOOK_EVENTS": "gate"}),
                      tiers=["pr"], matrix_path=matrix)
    assert sent == [] and handler.received == [], "the pr tier PASSED and regressions are not asked for"


def test_configuration_and_delivery_errors(hook) -> None:
    url, handler = hook
    assert WebhookConfig.from_env({}) is None
    with pytest.raises(ConfigError, match="unknown event"):
        WebhookConfig.from_env({"DISTCI_WEBHOOK_URL": url, "DISTCI_WEBHOOK_EVENTS": "regressions,fixes"})
    with pytest.raises(ConfigError, match="http"):
        WebhookConfig.from_env({"DISTCI_WEBHOOK_URL": "ftp://x"})
    handler.status = 500
    with pytest.raises(InfraError, match="HTTP 500"):
        post(url, {"text": "x"})


def test_a_passing_trouble_is_retried_and_a_lasting_one_is_one_infra_error(hook, monkeypatch) -> None:
    """A 503 then a 200 delivers the message once (urllib3's Retry, as the index reader
    does); a webhook that keeps answering 500 is an InfraError after the retries, naming the
    status; no answer at all is 'unreachable'."""
    from distci.publish import notify as notify_mod

    monkeypatch.setitem(notify_mod.WEBHOOK_RETRY, "backoff_factor", 0.0)
    url, handler = hook
    handler.failures = [503, 429]
    assert post(url, {"text": "hello"}) == 200
    assert [m["text"] for _, m in handler.received] == ["hello"] * 3, "two troubles retried, then delivered"
    handler.received.clear()
    handler.status = 500
    with pytest.raises(InfraError, match="HTTP 500"):
        post(url, {"text": "x"})
    assert len(handler.received) == 1 + notify_mod.WEBHOOK_RETRY["status"]
    with pytest.raises(InfraError, match="unreachable"):
        post("http://127.0.0.1:9/hook", {"text": "x"}, timeout=2)


def test_cli_is_off_without_a_url(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "distci", "notify", "--store", str(tmp_path / "none.sqlite")],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in __import__("os").environ.items() if k != "DISTCI_WEBHOOK_URL"})
    assert proc.returncode == 0 and "DISTCI_WEBHOOK_URL is not set" in proc.stdout
