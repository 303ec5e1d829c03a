"""Stable keys, the hidden markers that carry them, and timestamps.

An issue or comment written by the aggregate ends with markers such as
``<!-- distci:occurrence=KEY -->``; reading them back is how a rerun over the same
artifacts knows what it already wrote (the markers are the idempotency keys).
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone

_MARKER_RE = re.compile(r"<!-- distci:([a-z-]+)=([0-9a-f]+) -->")


def key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def marker(kind: str, value: str) -> str:
    return f"<!-- distci:{kind}={value} -->"


def markers(text: str) -> set[str]:
    """The distci markers (`kind=key`) hidden in an issue body or comment."""
    return {f"{k}={v}" for k, v in _MARKER_RE.findall(text or "")}


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
