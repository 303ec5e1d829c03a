"""The project's one GitHub REST client: PyGithub's requester, with its rate-limit retries.

It lives in provision/ (the lowest stage: where code comes from) so that both the CI glue
(distci/ci/: issues, labels, dispatches) and bisect (pytorch's compare and pull-request
reads) import it without an upward import.

distci needs a handful of endpoints (issues, comments, labels, workflow dispatches), so
it calls them by path through PyGithub's `Requester` rather than through PyGithub's
object model: the paths stay readable next to GitHub's REST documentation, and the fake
server of tests/test_aggregate.py answers exactly them. PyGithub brings what a hand-made
client lacked: `GithubRetry` waits out primary rate limits (until X-RateLimit-Reset) and
secondary ones (Retry-After, or `secondary_wait` seconds), and retries 5xx answers, and
writes are spaced by `write_interval` seconds as GitHub's best practices ask
($DISTCI_GITHUB_WRITE_INTERVAL; tests set 0).

Errors become one ConfigError line naming the endpoint, the status and the permission
the job most likely lacks; the token never appears in messages.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from distci.errors import ConfigError

DEFAULT_API_URL = "https://api.github.com"
# Permission a write most likely lacks when GitHub answers 403/404, by path prefix.
NEEDS = {"/issues": "issues: write", "/labels": "issues: write", "/actions/": "actions: write"}
_NEXT = re.compile(r'<([^>]+)>;\s*rel="next"')


@dataclass
class GitHub:
    """One repository's REST endpoints, reached by path (``/issues``, ``/labels/NAME`` ...)."""

    repo: str
    token: str = field(repr=False)
    api_url: str = DEFAULT_API_URL
    timeout: int = 30
    retries: int = 3
    secondary_wait: float = 60.0
    write_interval: float = 1.0
    _requester: Any = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_env(cls, repo: str | None = None, api_url: str | None = None,
                 environ: Mapping[str, str] | None = None) -> "GitHub":
        """The repository and token a workflow job has ($GITHUB_REPOSITORY, $GITHUB_TOKEN, $GITHUB_API_URL)."""
        env = os.environ if environ is None else environ
        repo = repo or env.get("GITHUB_REPOSITORY", "")
        token = env.get("GITHUB_TOKEN") or env.get("GH_TOKEN") or ""
        if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
            raise ConfigError("no repository: set GITHUB_REPOSITORY=owner/name or pass --repo")
        if not token:
            raise ConfigError("no GitHub token: set GITHUB_TOKEN (in Actions: env GITHUB_TOKEN: ${{ github.token }})")
        interval = env.get("DISTCI_GITHUB_WRITE_INTERVAL", "").strip()
        return cls(repo=repo, token=token, api_url=(api_url or env.get("GITHUB_API_URL") or DEFAULT_API_URL),
                   write_interval=float(interval) if interval else 1.0)

    def requester(self) -> Any:
        if self._requester is None:
            try:
                from github import Auth, Github, GithubRetry
            except ImportError:
                raise ConfigError("PyGithub is not installed: pip install distci") from None
            retry = GithubRetry(total=self.retries, backoff_factor=1.0, secondary_rate_wait=self.secondary_wait)
            auth = Auth.Token(self.token) if self.token else None  # anonymous: public reads only
            client = Github(auth=auth, base_url=self.api_url.rstrip("/"), timeout=self.timeout,
                            retry=retry, seconds_between_requests=None, seconds_between_writes=self.write_interval)
            self._requester = client.requester
        return self._requester

    def _path(self, path: str) -> str:
        return f"/repos/{self.repo}{path}"

    def request(self, method: str, path: str, body: Any = None, query: Mapping[str, Any] | None = None,
                *, url: str | None = None, allow: tuple[int, ...] = ()) -> tuple[int, Any, str]:
        """(status, decoded JSON or None, Link header). Statuses in `allow` are returned, not raised."""
        from github import GithubException

        target = url or self._path(path)
        try:
            headers, data = self.requester().requestJsonAndCheck(method, target, parameters=dict(query or {}) or None,
                                                                 input=body)
        except GithubException as exc:
            if exc.status in allow:
                return exc.status, exc.data if isinstance(exc.data, dict) else None, ""
            raise ConfigError(self._explain(method, path, exc.status, exc.data)) from None
        except (OSError, ValueError) as exc:  # connection refused, DNS, a non-JSON answer
            raise ConfigError(f"GitHub API at {self.api_url} is not reachable ({' '.join(str(exc).split())[:200]}); "
                              "check GITHUB_API_URL") from None
        link = next((v for k, v in (headers or {}).items() if k.lower() == "link"), "")
        return 200, data, link

    def _explain(self, method: str, path: str, status: int, data: Any) -> str:
        message = data.get("message", "") if isinstance(data, dict) else str(data or "")[:200]
        perm = next((p for prefix, p in NEEDS.items() if path.startswith(prefix)), "")
        hint = f"; the job needs `permissions: {perm}`" if perm and status in (403, 404) and method != "GET" else ""
        return f"GitHub API {method} /repos/{self.repo}{path}: HTTP {status} {message}".rstrip() + hint

    def paginate(self, path: str, query: Mapping[str, Any] | None = None, limit: int = 50) -> list[Any]:
        """Every item of a list endpoint, following Link rel=next (at most `limit` pages)."""
        items: list[Any] = []
        _, page, link = self.request("GET", path, query={**(query or {}), "per_page": 100})
        items += page or []
        for _ in range(limit - 1):
            match = _NEXT.search(link or "")
            if not match or not match.group(1).startswith(self.api_url.rstrip("/")):
                break
            _, page, link = self.request("GET", path, url=match.group(1))
            items += page or []
        return items
