"""The package-index reader: PEP 503 / 691 pages and find-links locations, as IndexEntry rows.

Used by distci.provision.sources (which versions a Source may resolve to) and by bisect (the
candidates between two endpoints). Reading only: nothing here decides what to install.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import ssl
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import unquote, urljoin, urlparse, urlsplit, urlunsplit
from urllib.request import url2pathname

from packaging.tags import Tag, sys_tags
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from distci.errors import InfraError, SourceError
from distci.sources import nightly_date

_SIMPLE_ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, "
    "text/html;q=0.1"
)


@dataclass(frozen=True)
class IndexEntry:
    """One distribution file offered by an index or a find-links location."""

    version: Version
    filename: str
    url: str
    sha256: str | None = None
    yanked: bool = False

    @property
    def is_wheel(self) -> bool:
        return self.filename.endswith(".whl")

    @property
    def tags(self) -> frozenset[Tag]:
        if not self.is_wheel:
            return frozenset()
        return parse_wheel_filename(self.filename)[3]

    @property
    def date(self) -> _dt.date | None:
        """The build date of a nightly (``2.12.0.dev20260301+cpu`` -> 2026-03-01)."""

        return nightly_date(self.version)

    def is_compatible(self, tags: Iterable[Tag] | None = None) -> bool:
        if not self.is_wheel:
            return False
        wanted = set(sys_tags()) if tags is None else set(tags)
        return bool(self.tags & wanted)


class _AnchorParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append(dict(attrs))


def _ssl_context(ca_bundle: str = "") -> ssl.SSLContext:
    cafile = ca_bundle or os.environ.get("DISTCI_CA_BUNDLE") or None
    return ssl.create_default_context(cafile=cafile)


# An index's passing troubles (a rate limit, a CDN's 5xx, a dropped connection) are retried
# with exponential backoff (0.5, 1, 2, 4 s), honouring Retry-After; a 404 is an answer.
# (urllib3's Retry; imported where it is used: the harness imports this module in cell
# environments, which need only stdlib + pytest + torch.)
INDEX_RETRY = {"total": 4, "backoff_factor": 0.5, "status_forcelist": (429, 500, 502, 503, 504),
               "allowed_methods": ("GET",), "respect_retry_after_header": True, "raise_on_status": False}


def _pool(url: str, ca_bundle: str) -> Any:
    """A urllib3 connection pool for `url` that retries as INDEX_RETRY says, through the
    proxy the environment names for it (HTTPS_PROXY / NO_PROXY, as urllib and pip read them)."""
    import urllib3

    scheme, host = urlsplit(url).scheme, urlsplit(url).hostname or ""
    proxy = urllib.request.getproxies().get(scheme)
    options = {"ssl_context": _ssl_context(ca_bundle), "retries": urllib3.util.Retry(**INDEX_RETRY)}
    if proxy and not urllib.request.proxy_bypass(host):
        return urllib3.ProxyManager(proxy, **options)
    return urllib3.PoolManager(**options)


def redact_url(url: str) -> str:
    """Hide credentials (user:token@) in a URL before it is printed or stored."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=f"***@{host}"))
    return url


def _read(url: str, *, ca_bundle: str = "", timeout: float = 60.0) -> tuple[bytes, str, str] | list[Path]:
    """Fetch a page: (body, content type, final url), or for a local directory its files."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        path = Path(url2pathname(parsed.path)) if parsed.scheme == "file" else Path(url)
        if path.is_dir():
            for name in ("index.html", "index.json"):
                if (path / name).is_file():
                    return (path / name).read_bytes(), "", (path / name).as_uri()
            return sorted(p for p in path.iterdir() if p.is_file())
        if path.is_file():
            return path.read_bytes(), "", path.as_uri()
        raise SourceError(f"{url} does not exist")
    if parsed.scheme not in ("http", "https"):
        raise SourceError(f"{redact_url(url)}: only file://, http:// and https:// indexes are supported")
    import urllib3

    try:
        resp = _pool(url, ca_bundle).request("GET", url, headers={"Accept": _SIMPLE_ACCEPT, "User-Agent": "distci"},
                                             timeout=urllib3.Timeout(total=timeout))
    except urllib3.exceptions.HTTPError as exc:  # retries spent: connection refused, reset, timed out
        reason = getattr(exc, "reason", None) or exc
        raise InfraError(f"cannot read index {redact_url(url)}: {reason}") from None
    if resp.status == 404:
        raise SourceError(f"{redact_url(url)}: not found (404)")
    if resp.status >= 400:
        tries = len(resp.retries.history) + 1 if resp.retries else 1
        raise InfraError(f"{redact_url(url)}: HTTP {resp.status} {resp.reason} ({tries} tries)")
    final = url
    for step in resp.retries.history if resp.retries else ():
        if step.redirect_location:
            final = urljoin(final, step.redirect_location)
    return resp.data, resp.headers.get("Content-Type", ""), final


def _entry(package: str, filename: str, url: str, sha256: str | None, yanked: bool) -> IndexEntry | None:
    try:
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        elif filename.endswith((".tar.gz", ".zip")):
            name, version = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    if name != canonicalize_name(package):
        return None
    return IndexEntry(version, filename, url, sha256, yanked)


def _parse_page(package: str, body: bytes, content_type: str, page_url: str) -> list[IndexEntry]:
    entries: list[IndexEntry] = []
    text = body.decode("utf-8", errors="replace")
    if "json" in content_type or text.lstrip().startswith("{"):
        try:
            files = json.loads(text).get("files", [])
        except (json.JSONDecodeError, AttributeError):
            raise SourceError(f"{redact_url(page_url)}: not a PEP 691 JSON page") from None
        for item in files:
            url = urljoin(page_url, item.get("url", ""))
            sha = (item.get("hashes") or {}).get("sha256")
            entry = _entry(package, item.get("filename", ""), url, sha, bool(item.get("yanked")))
            if entry:
                entries.append(entry)
        return entries
    parser = _AnchorParser()
    parser.feed(text)
    for attrs in parser.anchors:
        href = attrs.get("href")
        if not href:
            continue
        url, _, fragment = urljoin(page_url, href).partition("#")
        sha = fragment[len("sha256="):] if fragment.startswith("sha256=") else None
        filename = unquote(urlparse(url).path.rsplit("/", 1)[-1])
        entry = _entry(package, filename, url, sha, "data-yanked" in attrs)
        if entry:
            entries.append(entry)
    return entries


def _entries_at(location: str, package: str, *, ca_bundle: str = "") -> list[IndexEntry]:
    got = _read(location, ca_bundle=ca_bundle)
    if isinstance(got, list):
        found = (_entry(package, p.name, p.resolve().as_uri(), None, False) for p in got)
        return [e for e in found if e]
    body, ctype, final = got
    return _parse_page(package, body, ctype, final)


def list_index_versions(index_url: str, package: str, *, ca_bundle: str = "") -> list[IndexEntry]:
    """Every file of `package` on a PEP 503/691 simple index, oldest version first.

    `index_url` is the index root (``.../simple`` or a nightly ``.../whl/nightly/cpu``);
    file:// and http(s):// are accepted. A local directory without index.html is read as
    a flat directory of distribution files.
    """
    page = index_url.rstrip("/") + "/" + canonicalize_name(package) + "/"
    entries = _entries_at(page, package, ca_bundle=ca_bundle)
    return sorted(entries, key=lambda e: (e.version, e.filename))


def list_find_links(location: str, package: str, *, ca_bundle: str = "") -> list[IndexEntry]:
    """Files of `package` in a find-links location (a directory or an HTML page of links)."""
    entries = _entries_at(location, package, ca_bundle=ca_bundle)
    return sorted(entries, key=lambda e: (e.version, e.filename))
