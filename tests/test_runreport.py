"""`distci report`: one evidence page for one cell's shards, judged again by today's registry.

The nightly and GPU pages under reports/ are written from run directories after the fact;
when the registry changed since the run (an entry widened, or withdrawn), the page must say
what the gate says now, through the one matcher, not what the harness recorded then.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from fixtures_runs import stack, write_run

from distci.known_issues import load_registry
from distci.run.runreport import render
from distci.rundir import RunDirError

CELL = "cpu-cpu-torch_installed-ao_0.17.0-ws2-fix_off"
T0 = datetime(2026, 12, 5, 3, 40, tzinfo=timezone.utc)
REGISTRY = """
[[issue]]
id = "upstream1-widened"
title = "a failure the run recorded as new; the registry learned it later"
tests = ["suites/test_scenarios.py::test_scenario?tp_sp-*"]
signature = "mask materialized twice"
upstream = "https://github.com/pytorch/pytorch/issues/1"
[issue.applies]
torch = ">=2.11"
"""


def _shards(tmp_path: Path) -> list[Path]:
    st = stack(torch="2.11.0+cu130")
    one = write_run(tmp_path, "r1", CELL, [
        {"test_id": "suites/test_scenarios.py::test_scenario[tp_sp-eager-clip_norm]", "outcome": "failed",
         "error_signature": "RuntimeError: mask materialized\n  twice", "message": "RuntimeError: mask materialized\n  twice"},
        {"test_id": "suites/test_scenarios.py::test_scenario[fsdp-eager]", "outcome": "failed",
         "error_signature": "AssertionError: loss differs", "message": "AssertionError: loss differs",
         "known_issue": "withdrawn-entry"},
    ], started_at=T0, stack=st, selection=["--shard", "1/2"])
    two = write_run(tmp_path, "r2", CELL, [
        {"test_id": "suites/test_scenarios.py::test_scenario[tp_sp-eager]", "outcome": "passed"},
        {"test_id": "suites/test_scenarios.py::test_scenario[cp-eager]", "outcome": "skipped",
         "message": "Skipped: context parallel cannot shard CPU attention"},
        {"test_id": "suites/test_single_device.py::test_single_device[single-eager-ws1]", "outcome": "error",
         "failure_kind": "infra", "message": "Interrupted: stopped by SIGINT"},
    ], started_at=T0, stack=st, selection=["--shard", "2/2"])
    return [one, two]


def _row(page: str, test: str) -> list[str]:
    line = next(ln for ln in page.splitlines() if ln.startswith(f"| `{test}`"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_one_page_for_a_cells_shards_judged_by_todays_registry(tmp_path: Path) -> None:
    registry_path = tmp_path / "known_issues.toml"
    registry_path.write_text(REGISTRY)
    page = render(_shards(tmp_path / "runs"), title="t", command="c", registry=load_registry(registry_path))

    assert "| r1 | --shard 1/2 |" in page and "| r2 | --shard 2/2 |" in page
    assert "1 failed, 1 fixed, 1 infra, 1 known, 1 skipped" in page
    # the signature wrapped across lines still matches (the one matcher normalizes whitespace)
    assert _row(page, "suites/test_scenarios.py::test_scenario[tp_sp-eager-clip_norm]")[1] == "known"
    # an entry the registry no longer has explains nothing any more
    assert _row(page, "suites/test_scenarios.py::test_scenario[fsdp-eager]")[1] == "failed"
    # a pass inside an entry's scope is a warning that the entry may retire
    assert _row(page, "suites/test_scenarios.py::test_scenario[tp_sp-eager]")[1] == "fixed"
    assert "Known issues matched: `upstream1-widened` 1" in page
    assert "(`fixed`, a warning): `upstream1-widened` 1" in page
    infra = _row(page, "suites/test_single_device.py::test_single_device[single-eager-ws1]")
    assert infra[1] == "infra" and "SIGINT" in infra[4]
    tests = [ln.split("`")[1] for ln in page.splitlines() if ln.startswith("| `")]
    assert tests == sorted(tests)


def test_without_a_registry_the_page_says_what_was_recorded(tmp_path: Path) -> None:
    page = render(_shards(tmp_path / "runs"), title="t", command="c")
    assert _row(page, "suites/test_scenarios.py::test_scenario[fsdp-eager]")[1] == "known"
    assert _row(page, "suites/test_scenarios.py::test_scenario[tp_sp-eager-clip_norm]")[1] == "failed"


def test_runs_of_two_cells_are_refused_with_their_names(tmp_path: Path) -> None:
    dirs = _shards(tmp_path / "runs")
    other = write_run(tmp_path / "runs", "r3", "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off",
                      [{"test_id": "suites/test_scenarios.py::test_scenario[tp-eager]"}], started_at=T0, stack=stack())
    with pytest.raises(RunDirError, match="cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"):
        render([*dirs, other], title="t", command="c")


def test_the_command_reads_a_registry_and_names_a_bad_one(tmp_path: Path) -> None:
    dirs = _shards(tmp_path / "runs")
    good = tmp_path / "known_issues.toml"
    good.write_text(REGISTRY)
    out = tmp_path / "page.md"
    ok = subprocess.run([sys.executable, "-m", "distci", "report", *map(str, dirs), "--title", "t", "--command", "c",
                         "--known-issues", str(good), "--out", str(out)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "1 known" in out.read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text("[[issue]]\nid = 3\n")
    failed = subprocess.run([sys.executable, "-m", "distci", "report", *map(str, dirs), "--title", "t", "--command", "c",
                             "--known-issues", str(bad)], capture_output=True, text=True)
    assert failed.returncode != 0
    assert "bad.toml" in failed.stderr and "Traceback" not in failed.stderr


def test_runs_of_two_stacks_are_refused(tmp_path: Path) -> None:
    """An installed cell has one id on every interpreter: one page must not mix torch 2.10's
    answers with 2.12's."""
    dirs = _shards(tmp_path / "runs")
    other = write_run(tmp_path / "runs", "r4", CELL, [{"test_id": "suites/test_scenarios.py::test_scenario[tp-eager]"}],
                      started_at=T0, stack=stack(torch="2.12.1+cu130"))
    with pytest.raises(RunDirError, match="one stack's runs.*torch 2.11.0.*torch 2.12.1"):
        render([*dirs, other], title="t", command="c")


def test_a_failure_an_entry_misses_only_by_its_range_is_named(tmp_path: Path) -> None:
    """On a stack outside an entry's range, the entry's failure stays `failed` (a range is
    widened only on evidence), and the page names the entry and why it did not apply."""
    registry_path = tmp_path / "known_issues.toml"
    registry_path.write_text(REGISTRY.replace('torch = ">=2.11"', 'torch = ">=2.13"'))
    page = render(_shards(tmp_path / "runs"), title="t", command="c", registry=load_registry(registry_path))
    row = _row(page, "suites/test_scenarios.py::test_scenario[tp_sp-eager-clip_norm]")
    assert row[1] == "failed"
    assert row[4].startswith("near miss upstream1-widened (applies to torch >=2.13; this stack has torch 2.11.0+cu130)")
    assert ("Failures an entry would explain but for where it applies (a range drawn too narrow? widen it only on "
            "evidence): `upstream1-widened (applies to torch >=2.13; this stack has torch 2.11.0+cu130)` 1") in page
