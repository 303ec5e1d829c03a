"""The pr-tier benchmark's phase split, read back from a run directory alone."""

from __future__ import annotations

from pathlib import Path

from distci.bench.pr import phases_of
from distci.results import Result
from distci.rundir import RunDir, RunInfo


def _result(test: str, started: str, seconds: float) -> Result:
    return Result(run_id="r1", cell_id="cpu-x", test_id=f"suites/test_scenarios.py::{test}", outcome="passed",
                  stack={}, duration_s=seconds, started_at=started)


def test_wall_time_splits_into_provision_tests_between_and_closing(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "r1")
    run.write_info(RunInfo(run_id="r1", cell_id="cpu-x", started_at="2026-12-01T10:00:00+00:00",
                           ended_at="2026-12-01T10:02:00+00:00"))
    for r in (_result("test_scenario[tp-compile_model]", "2026-12-01T10:00:30+00:00", 40.0),
              _result("test_scenario[tp-eager]", "2026-12-01T10:01:15+00:00", 5.0),   # 5 s after the first ended
              _result("test_other", "2026-12-01T10:01:20+00:00", 10.0)):
        run.append(r)
    p = phases_of(run.path)
    assert (p.wall_s, p.provision_s, p.compiled_s, p.eager_s, p.other_s) == (120.0, 30.0, 40.0, 5.0, 10.0)
    assert p.between_s == 5.0 and p.closing_s == 30.0 and p.tests == 3
    assert p.slowest[0] == ("test_scenario[tp-compile_model]", 40.0)
    assert p.wall_s == p.provision_s + p.compiled_s + p.eager_s + p.other_s + p.between_s + p.closing_s
