"""How distci's own tests are spread over pytest-xdist workers (`-n N --dist loadfile`).

Three rules, read by the scheduler below (tests/conftest.py hands it to xdist):
- **A file stays on one worker**: its module fixtures (a controller run shared by the fault cases,
  the rank pool of the suite mutations) are made once, as in a serial run.
- **Files that share what cannot be made per worker share a worker** (`SHARED`, each with its
  reason): they run one after another there, never side by side.
- **Heaviest first**: files are handed out by the wall seconds a serial run spent in them
  (`DURATIONS`, tests/durations.json), so the long files start at once and the light ones fill
  the gaps at the end instead of one long file running alone after everything else. A file
  missing from it (new, or under a second) goes after the measured ones.

Everything a test makes for itself (run directories, ports, namespaces, store files, scratch)
is already its own (`tmp_path`, a uuid tag, a run token); the caches the tests share (the
wheelhouse, the cell envs, distci's own wheels, inductor's cache) are made under file locks or
atomically, as two cell runs on one machine need anyway.

`python tests/workers.py REPORT.json` rewrites tests/durations.json from a `--cpu-report`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

DURATIONS = Path(__file__).with_name("durations.json")

SHARED = {
    # One Docker daemon: the session fixture (tests/dockerd.py) starts it when none answers,
    # and two workers finding none would start two on the same socket; the image tests also
    # build and retag the same cell image.
    "tests/test_images.py": "docker",
    "tests/test_bisect_docker.py": "docker",
    "tests/test_job_steps.py": "docker",
}


def scope_of(nodeid: str) -> str:
    """The unit a worker is handed: the test's file, or the group the file shares."""
    path = nodeid.split("::", 1)[0]
    return SHARED.get(path, path)


def durations(path: Path = DURATIONS) -> dict[str, float]:
    """Wall seconds per test file from a serial run ({} when the file is missing or unreadable:
    the order then falls back to xdist's, most tests first)."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text())["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def make_scheduler(config, log, weights: dict[str, float] | None = None):
    """A LoadScopeScheduling with `scope_of` as its unit, units handed out heaviest first
    (`weights`: wall seconds per file; default tests/durations.json)."""
    from xdist.scheduler import LoadScopeScheduling

    weights = durations() if weights is None else weights

    class FileScheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first call comes right after schedule() filled the queue
                self.ordered = True
                # sorted() is stable: units of equal weight keep xdist's order (most tests first)
                units = sorted(self.workqueue.items(), key=lambda unit: -_unit_weight(unit[0], weights))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return FileScheduling(config, log)


def _unit_weight(scope: str, weights: dict[str, float]) -> float:
    files = [path for path, group in SHARED.items() if group == scope] or [scope]
    return sum(weights.get(path, 0.0) for path in files)


def write_durations(report: Path, out: Path = DURATIONS) -> dict[str, float]:
    """Each file's wall seconds (sum of its tests') from a `--cpu-report` JSON, written to `out`."""
    files: dict[str, float] = {}
    for test in json.loads(report.read_text())["tests"]:
        path = test["nodeid"].split("::", 1)[0]
        files[path] = files.get(path, 0.0) + test["wall_s"]
    ordered = dict(sorted(((p, round(s, 1)) for p, s in files.items()), key=lambda kv: -kv[1]))
    out.write_text(json.dumps({"from": report.name, "files": ordered}, indent=1) + "\n")
    return ordered


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/workers.py REPORT.json (a --cpu-report of a serial run)")
    write_durations(Path(sys.argv[1]))
