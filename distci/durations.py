"""How a duration is written for a person: one format everywhere a run speaks.

`42s`, `3m05s`, `1h02m`, `4d11h`: short enough for an 80-column line, and the same in
a heartbeat, a per-test line, the summary and a provisioning step's "ready in".
"""

from __future__ import annotations


def format_duration(seconds: float) -> str:
    """`42s`, `3m05s`, `1h02m`, `4d11h`."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 2 * 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"
