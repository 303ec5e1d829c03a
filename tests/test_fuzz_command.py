"""`distci fuzz` without running a configuration: its arguments, what it prints for a find,
its reports, the nightly job that runs it, and how the aggregate files what it finds."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from distci.errors import FuzzSpecError
from distci.fuzz import command as cmd
from distci.fuzz.report import FuzzRun, render_report, repro, table_row, update_coverage
from distci.fuzz import space as fuzz_space
from distci.fuzz.records import Find, Outcome, Report
from distci.stack import Stack
from suites.scenario import table as sc
from suites.generators import space as cell
from suites.generators.space import ENTRY_TEST, key, point_of


def Space(**kwargs) -> fuzz_space.Space:
    """The fuzzer's space over this checkout's cell side (what `distci fuzz` builds)."""
    return fuzz_space.Space(cell, **kwargs)

from fixtures_runs import stack, write_run

REPO = Path(__file__).resolve().parents[1]
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("30m", 1800), ("1.5h", 5400)])
def test_budget(text, seconds):
    assert cmd.parse_budget(text) == seconds


def test_bad_inputs_name_themselves():
    with pytest.raises(FuzzSpecError, match="--budget '30 min'"):
        cmd.parse_budget("30 min")
    with pytest.raises(FuzzSpecError, match="no axis 'acc'; axes: parallel"):
        cmd.build_space("cpu", ["acc=none"])
    with pytest.raises(FuzzSpecError, match="write AXIS=V1,V2"):
        cmd.build_space("cpu", ["ac"])
    with pytest.raises(FuzzSpecError, match="mixed precision is FSDP2's"):
        cmd.parse_replay(Space(), '{"mp": "bf16"}')
    with pytest.raises(FuzzSpecError, match="unknown axis"):
        cmd.parse_replay(Space(), '{"acc": 2}')


def test_space_values_parse_by_their_type():
    space = cmd.build_space("cpu", ["world_size=2", "async_tp=false", "accum=1,2"])
    assert space.fixed == {"world_size": 2, "async_tp": False}
    assert space.axis("accum").values == (1, 2)


def test_a_printed_row_pastes_into_the_table_as_the_same_scenario():
    space = Space()
    for row in sc.TABLE:
        printed = table_row(space, point_of(row))
        built = eval(printed.rstrip(","), {"row": sc.row})  # noqa: S307 - our own printed row
        assert built.id == row.id, printed


def test_a_repro_is_a_command_that_selects_the_configuration():
    point = Space().complete({"parallel": "fsdp", "ac": "full"})
    assert repro(Space(), CELL, point) == (f"nox -s dist_tests -- --cell {CELL} "
                                           f"--test '{ENTRY_TEST}::test_fuzz_config[fsdp-eager-ac_full]'")


def test_a_scenario_id_names_its_point():
    from suites.generators.space import point_from_id

    for row in sc.TABLE:
        assert point_from_id(row.id) == point_of(row), row.id
    with pytest.raises(ValueError, match="no column's fragment"):
        point_from_id("tp-eager-ac_sometimes")
    with pytest.raises(ValueError, match="names no valid configuration"):
        point_from_id("tp-eager-mp_bf16")


@pytest.mark.slow  # imports torch
@pytest.mark.filterwarnings("ignore::pytest.PytestUnknownMarkWarning")  # the harness's markers, unregistered here
def test_the_entry_reads_the_repro_config(monkeypatch):
    pytest.importorskip("torch")
    from suites import fuzz_entry

    monkeypatch.delenv(fuzz_entry.CONFIGS_ENV, raising=False)
    monkeypatch.setenv(fuzz_entry.CONFIG_ENV, '{"ac": "full", "parallel": "fsdp"}')
    (param,) = fuzz_entry.params()
    assert param.id == "fsdp-eager-ac_full"
    monkeypatch.delenv(fuzz_entry.CONFIG_ENV)
    assert fuzz_entry.params() == []
    (param,) = fuzz_entry.params(["-q", f"{ENTRY_TEST}::test_fuzz_config[tp-eager-loss_parallel-eval_inference]"])
    assert param.values[0].loss_parallel and param.values[0].eval == "inference"


def test_public_command_keeps_no_machine_path():
    line = cmd.public_command(["python", "-m", "distci", "fuzz", "--python", "/srv/envs/x/bin/python",
                               "--report", "/var/scratch/a/fuzz-x.md"])
    assert "/srv" not in line and "/var" not in line and "PYTHON" in line and "fuzz-x.md" in line


def _outcome(point, outcome="passed", sig=None):
    return Outcome(Space().complete(point), outcome, sig, 2.0, test_id=f"{ENTRY_TEST}::test_fuzz_config[{key(point)}]",
                   key=key(point))


def test_report_lists_every_configuration_and_the_coverage_section_is_replaced(tmp_path):
    found = _outcome({"parallel": "fsdp", "ac": "full", "optim": "adamw"}, "failed", "AssertionError: x")
    shrunk = _outcome({"parallel": "fsdp", "ac": "full"}, "failed", "AssertionError: x")
    report = Report(tried=[_outcome({}), found, shrunk], drawn=[key({}), found.key],
                    finds=[Find(found, shrunk, [shrunk.key])])
    run = FuzzRun(CELL, "s", 60, Space(), "/x/run-1", Stack.from_dict({"torch": "2.13.0", "python": "3.11"}))
    text = render_report(run, report, "2026-12-01T00:00:00Z", "python -m distci fuzz")
    assert text.count("| drawn |") == 2 and text.count("| shrink |") == 1
    assert "row('fsdp', ac='full')," in text and "torch 2.13.0" in text
    page = tmp_path / "fuzz-coverage.md"
    update_coverage(page, run, report.tried)
    update_coverage(page, run, report.tried[:1])
    body = page.read_text()
    assert body.count(f"## {CELL}") == 1 and "1 configurations" in body
    assert "| ac | none: 1, full: 0, selective: 0 |" in body


@pytest.mark.slow  # two interpreters
def test_list_prints_the_seeds_draws_the_same_way_twice():
    args = [sys.executable, "-m", "distci", "fuzz", "--cell", CELL, "--list", "--seed", "x", "--max-configs", "7"]
    one = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120, check=True).stdout
    two = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120, check=True).stdout
    assert one == two and len(one.split()) == 7


def test_the_nightly_fuzz_job_runs_a_matrix_cell_and_feeds_the_aggregate():
    from distci.matrix import load_matrix

    jobs = yaml.safe_load((REPO / ".github" / "workflows" / "nightly.yml").read_text())["jobs"]
    job = jobs["fuzz"]
    assert load_matrix(REPO / "matrix.toml").select(cell_ids=[job["env"]["CELL"]])
    assert job["env"]["CELL"].startswith("cpu-")
    runs = [s["run"] for s in job["steps"] if "run" in s]
    assert any(r.startswith('nox -s fuzz -- --cell "$CELL"') and "--seed" not in r for r in runs)  # date = seed
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["with"]["name"].startswith("run-")  # the aggregate downloads run-*
    assert "fuzz" in jobs["aggregate"]["needs"]


def test_the_aggregate_files_a_fuzz_find_by_its_signature(tmp_path):
    from distci.ci.regressions import regressions
    from distci.judge.rows import FUZZ_TESTS
    from distci.judge.ingest import ingest_runs
    from distci.judge.store import Store

    assert FUZZ_TESTS == f"{ENTRY_TEST}::"
    sig = "AssertionError: the last step ran N FSDP all-gathers"
    write_run(tmp_path / "runs", "fuzz-run", CELL, [
        {"test_id": f"{ENTRY_TEST}::test_fuzz_config[fsdp-eager-ac_full]", "outcome": "failed",
         "failure_kind": "assert", "error_signature": sig, "message": sig},
        {"test_id": f"{ENTRY_TEST}::test_fuzz_config[tp-eager]"},
        {"test_id": "suites/test_scenarios.py::test_scenario[tp-eager]", "outcome": "failed",
         "failure_kind": "assert", "error_signature": "AssertionError: other", "message": "other"},
    ], started_at=datetime(2026, 12, 1, tzinfo=timezone.utc), stack=stack(torch="2.13.0"))
    with Store(tmp_path / "store.sqlite") as store:
        ingest_runs(store, [tmp_path / "runs"])
        found = regressions(store, ["fuzz-run"])
    assert [(g.test_id, g.signature) for g in found] == [
        (f"{ENTRY_TEST}::test_fuzz_config[fsdp-eager-ac_full]", sig)]  # a table test without history is not filed


def test_known_issues_of_the_table_explain_the_same_scenario_fuzzed(tmp_path):
    from distci.known_issues import load_registry

    out = cmd.fuzz_registry(REPO / "suites" / "known_issues.toml", tmp_path / "ki.toml")
    table, fuzzed = load_registry(REPO / "suites" / "known_issues.toml"), load_registry(out)
    assert len(table.entries) == len(fuzzed.entries)
    for entry in table.entries:
        for pattern in entry.tests:
            if pattern.startswith("suites/test_scenarios.py::test_scenario?"):
                twin = pattern.replace("suites/test_scenarios.py::test_scenario", f"{ENTRY_TEST}::test_fuzz_config")
                assert twin in next(e for e in fuzzed.entries if e.id == entry.id).tests
    assert any(p.startswith(ENTRY_TEST) for e in fuzzed.entries for p in e.tests)


def test_shrink_limit_parses_and_bad_one_names_itself():
    args = cmd_parser().parse_args(["fuzz", "--cell", CELL, "--shrink-limit", "10m"])
    assert cmd.parse_budget(args.shrink_limit) == 600
    with pytest.raises(FuzzSpecError, match="--shrink-limit '10 min'"):
        cmd.parse_budget("10 min", "--shrink-limit")


def cmd_parser():
    import argparse

    parser = argparse.ArgumentParser()
    cmd.add_parser(parser.add_subparsers())
    return parser
