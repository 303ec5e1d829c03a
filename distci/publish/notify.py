"""Optional notifications: a webhook message for new regressions and for a release gate
that is not PASSED, in Slack-compatible JSON (`text` plus `blocks`).

Configured by environment only, so a workflow turns it on with a secret and nothing
in the repository names an endpoint:

    DISTCI_WEBHOOK_URL      where to POST (unset: notifications are off)
    DISTCI_WEBHOOK_EVENTS   comma list of `regressions`, `gate` (default: both)
    DISTCI_DASHBOARD_URL    linked from every message, when set

`python -m distci notify [--tier release ...]` reads the store: regressions are the
latest runs' results with verdict `regression` (new since the run before, by
definition), the gate is the release view's answer per tier (distci.dashboard.release,
which asks distci.judge.gate). A message that cannot be delivered is an InfraError: the
job that asked for it fails and says why.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from distci.errors import ConfigError, InfraError, SelectionError
from distci.judge.store import Store, default_store_path
from distci.judge.rows import ResultRow

URL_ENV = "DISTCI_WEBHOOK_URL"
EVENTS_ENV = "DISTCI_WEBHOOK_EVENTS"
DASHBOARD_ENV = "DISTCI_DASHBOARD_URL"
EVENTS = ("regressions", "gate")
MAX_LISTED = 15
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class WebhookConfig:
    url: str
    events: tuple[str, ...] = EVENTS
    dashboard_url: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "WebhookConfig | None":
        """None when DISTCI_WEBHOOK_URL is unset; a ConfigError for a bad URL or event name."""
        env = os.environ if environ is None else environ
        url = env.get(URL_ENV, "").strip()
        if not url:
            return None
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{URL_ENV} must be an http(s) URL")
        events = tuple(e.strip() for e in env.get(EVENTS_ENV, ",".join(EVENTS)).split(",") if e.strip())
        unknown = [e for e in events if e not in EVENTS]
        if unknown:
            raise ConfigError(f"{EVENTS_ENV}: unknown event(s) {', '.join(unknown)}; known: {', '.join(EVENTS)}")
        return cls(url, events, env.get(DASHBOARD_ENV, "").strip())


def mrkdwn(text: object) -> str:
    """Text as Slack shows it literally: `&`, `<` and `>` escaped as Slack requires, so a
    test id or message can never open a link, mention (`<!channel>`) or tag."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code(text: object) -> str:
    """`text` as a Slack code span: escaped, and a backtick inside cannot end the span."""
    return "`" + mrkdwn(text).replace("`", "'") + "`"


def link(url: str, label: str) -> str:
    """A Slack link to an http(s) URL (anything else: no link), its `|` and `>` encoded."""
    if not re.match(r"https?://", url or ""):
        return ""
    safe = url.replace("|", "%7C").replace(">", "%3E").replace("<", "%3C").replace(" ", "%20")
    return f"<{safe}|{mrkdwn(label)}>"


def _message(text: str, lines: Sequence[str], dashboard_url: str) -> dict[str, Any]:
    body = "\n".join(lines[:MAX_LISTED])
    if len(lines) > MAX_LISTED:
        body += f"\n… and {len(lines) - MAX_LISTED} more"
    if link(dashboard_url, "dashboard"):
        body += "\n" + link(dashboard_url, "dashboard")
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": f"*{mrkdwn(text)}*"}}]
    if body.strip():
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": body}})
    return {"text": text, "blocks": blocks}


def regressions_message(regressions: Sequence[ResultRow], dashboard_url: str = "") -> dict[str, Any] | None:
    """One message for all new regressions, grouped by error signature; None when there are none."""
    if not regressions:
        return None
    groups: dict[str, list[ResultRow]] = {}
    for r in regressions:
        groups.setdefault(r.error_signature or r.verdict_reason or "regression", []).append(r)
    cells = sorted({r.cell_id for r in regressions})
    text = (f"distci: {len(regressions)} new regression{'s' if len(regressions) != 1 else ''} in "
            f"{len(cells)} cell{'s' if len(cells) != 1 else ''} ({len(groups)} signature{'s' if len(groups) != 1 else ''})")
    lines = []
    for sig, rows in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        where = ", ".join(sorted({r.cell_id for r in rows}))
        lines.append(f"• {code(sig)}: {len(rows)} test{'s' if len(rows) != 1 else ''} in {mrkdwn(where)} "
                     f"(e.g. {code(rows[0].test_id)})")
    return _message(text, lines, dashboard_url)


def gate_message(view: Any, dashboard_url: str = "") -> dict[str, Any] | None:
    """A message for a tier whose gate says BLOCKED or INCOMPLETE (a release view TierView)."""
    if view.status == "PASSED":
        return None
    text = f"distci gate {view.status} for tier {view.tier}"
    lines = [f"• blocking: {code(b.test_id)} in {mrkdwn(b.cell_id)}"
             + (f": {code(b.error_signature)}" if b.error_signature else "") for b in view.blocking]
    lines += [f"• {mrkdwn(c.cell_id)} is {c.state.replace('_', ' ')}: {mrkdwn(c.reason)}" for c in view.not_ok]
    return _message(text, lines, dashboard_url)


WEBHOOK_RETRY = {"total": 3, "connect": 3, "read": 0, "status": 3, "backoff_factor": 0.5,
                 "status_forcelist": (429, 500, 502, 503, 504), "allowed_methods": ("POST",),
                 "respect_retry_after_header": True, "raise_on_status": False}
"""How a webhook post is retried (urllib3's Retry): a refused connection and a 429 / 5xx answer
(Slack's rate limit, a proxy's hiccup) are tried again with backoff, honouring Retry-After; a
read that timed out is not, since the message may have been delivered (no duplicate posts)."""


def post(url: str, message: dict[str, Any], *, timeout: float = TIMEOUT_S) -> int:
    """POSTs the JSON message (retried as WEBHOOK_RETRY says, through the proxy the environment
    names); returns the HTTP status, InfraError when the last answer is not 2xx."""
    import urllib3

    scheme, host = urllib.parse.urlsplit(url).scheme, urllib.parse.urlsplit(url).hostname or ""
    proxy = urllib.request.getproxies().get(scheme)
    options: dict[str, Any] = {"retries": urllib3.util.Retry(**WEBHOOK_RETRY),
                               "timeout": urllib3.util.Timeout(total=timeout)}
    pool = (urllib3.ProxyManager(proxy, **options) if proxy and not urllib.request.proxy_bypass(host)
            else urllib3.PoolManager(**options))
    try:
        response = pool.request("POST", url, body=json.dumps(message).encode(),
                                headers={"Content-Type": "application/json", "User-Agent": "distci"})
    except urllib3.exceptions.HTTPError as exc:
        reason = getattr(exc, "reason", None) or exc
        raise InfraError(f"webhook unreachable: {reason}; message not delivered") from None
    finally:
        pool.clear()
    if not 200 <= response.status < 300:
        raise InfraError(f"webhook answered HTTP {response.status} ({response.reason}); message not delivered")
    return response.status


def notify(store: Store, config: WebhookConfig, *, tiers: Sequence[str], matrix_path: Path | None) -> list[dict]:
    """Builds and sends the messages the configured events call for; returns what was sent."""
    messages = []
    if "regressions" in config.events:
        latest = store.latest_runs()
        found = [r for run in latest.values() for r in store.results(run_id=run.run_id) if r.verdict == "regression"]
        msg = regressions_message(found, config.dashboard_url)
        if msg:
            messages.append(msg)
    if "gate" in config.events and tiers:
        from distci.dashboard.release import release_views

        views = {v.tier: v for v in release_views(store, matrix_path)}
        missing = [t for t in tiers if t not in views]
        if missing:
            raise SelectionError(f"tier {', '.join(missing)} is not declared in {matrix_path}")
        for tier in tiers:
            msg = gate_message(views[tier], config.dashboard_url)
            if msg:
                messages.append(msg)
    for msg in messages:
        post(config.url, msg)
    return messages


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "notify", help="post new regressions and a not-PASSED gate to a webhook ($DISTCI_WEBHOOK_URL)",
        description="Post Slack-compatible webhook messages: new regressions in the latest runs, and each "
        "--tier whose gate is BLOCKED or INCOMPLETE. Off unless DISTCI_WEBHOOK_URL is set.")
    p.add_argument("--tier", action="append", dest="tiers", default=None, help="tier whose gate is reported (repeatable; default release)")
    p.add_argument("--store", type=Path, default=None, help="store file (default $DISTCI_STORE or .distci/store.sqlite)")
    p.add_argument("--matrix", default=argparse.SUPPRESS, help="matrix file declaring the tiers (default matrix.toml)")
    p.set_defaults(fn=run)
    return p


def run(args: argparse.Namespace) -> int:
    config = WebhookConfig.from_env()
    if config is None:
        print(f"distci notify: {URL_ENV} is not set; nothing sent")
        return 0
    store_path = args.store or default_store_path()
    if not Path(store_path).exists():
        raise SelectionError(f"no store at {store_path}; run `nox -s ingest -- PATH...` first")
    with Store(store_path) as store:
        sent = notify(store, config, tiers=args.tiers or ["release"], matrix_path=Path(getattr(args, "matrix", "matrix.toml")))
    for msg in sent:
        print(f"distci notify: sent: {msg['text']}")
    if not sent:
        print("distci notify: nothing to report")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m distci.publish.notify` is `python -m distci notify`."""
    from distci.command import run_module

    return run_module(add_parser, argv)


if __name__ == "__main__":
    sys.exit(main())
