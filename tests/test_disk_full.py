"""A full disk or a file-size limit while a run records (issue 28, Build 3), for real: the
harness runs under RLIMIT_FSIZE in a child process, so its writes fail as they would on a
full disk (EFBIG, the same path as ENOSPC).

What must hold: every line results.jsonl keeps is a whole Result (the failed write is
undone), the run stops and ends as `infra` with a message naming the cause (exit 75),
junit.xml is valid XML, and a test that itself hits the limit is `infra`, not a failure.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from distci.results import LineProblem
from distci.rundir import RECORD_LOST_EXIT, RESULTS_FILE, numbered_results
from distci.run.cellrun import QUIET_PLUGINS

LIMIT = 16 * 1024  # bytes per file: a few Results (each carries its stack), far more than a JUnit testcase

TESTS = '''
import pytest

def test_00_writes_past_the_limit(tmp_path):
    (tmp_path / "big.bin").write_bytes(b"x" * (2 * LIMIT))

@pytest.mark.parametrize("n", range(40))
def test_passes(n):
    pass
'''.replace("LIMIT", str(LIMIT))


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


@pytest.mark.slow
def test_a_file_size_limit_keeps_results_whole_and_ends_the_run_as_infra(tmp_path: Path) -> None:
    (tmp_path / "test_many.py").write_text(TESTS)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-q",
         f"--distci-run-dir={run_dir}", "--distci-cell=cpu-limit-test", "--distci-run-id=limited",
         f"--basetemp={tmp_path / 'base'}", "test_many.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, preexec_fn=_limited)
    out = proc.stdout + proc.stderr
    assert proc.returncode == RECORD_LOST_EXIT, out[-3000:]
    assert "INTERNALERROR" not in out and "cannot record" in out and "stopping the run (infra)" in out

    problems: list[LineProblem] = []
    kept = [r for _, r in numbered_results(run_dir / RESULTS_FILE, problems)]
    assert problems == [], "a torn line: the failed write was not undone"
    assert (run_dir / RESULTS_FILE).stat().st_size <= LIMIT
    assert 2 <= len(kept) < 41, len(kept)  # some recorded, the run stopped long before the end
    first = kept[0]
    assert first.test_id.endswith("test_00_writes_past_the_limit")
    assert first.outcome == "failed" and first.failure_kind == "infra" and "File too large" in first.message

    junit = ET.parse(run_dir / "junit.xml").getroot()  # valid XML, not 0 bytes
    cases = list(junit.iter("testcase"))
    infra = next(c for c in cases if (c.get("classname"), c.get("name")) == ("<infra>", "cpu-limit-test")).find("error")
    assert infra is not None and infra.get("type") == "infra" and "cannot record" in infra.get("message")
    assert len(cases) == len(kept) + 1  # every kept result, and the infra record JUnit alone could hold


CHILD = '''
import resource, sys
from pathlib import Path
from distci.results import Result
from distci.rundir import RunDir
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
rd = RunDir(Path(sys.argv[1]))
def infra(message):
    return Result(run_id="r", cell_id="c", test_id="<infra>::c", outcome="error", failure_kind="infra", message=message,
                  stack={})
small = infra("small")
big = infra("x" * 8000)
assert rd.append_closing([small], "c") is None
err = rd.append_closing([big], "c")
print(type(err).__name__, err)
'''


def test_a_closing_record_that_does_not_fit_is_reported_not_raised(tmp_path: Path) -> None:
    """What a controller appends when it closes a run (an infra record) on a full disk: the
    error comes back to be printed, the file keeps its whole records, JUnit stays valid."""
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("RecordError [Errno 27] cannot record <infra>::c"), proc.stdout
    problems: list[LineProblem] = []
    assert len(list(numbered_results(tmp_path / RESULTS_FILE, problems))) == 1 and problems == []
    ET.parse(tmp_path / "junit.xml")
