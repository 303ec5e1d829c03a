"""The release gate, and the HUD relay export that reports the same verdicts upstream."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fixtures_runs import (
    INFRA,
    NIGHTLY_OFF,
    NIGHTLY_ON,
    REG_TANGENT,
    RELEASE_CUDA,
    RELEASE_NPU,
    seed_nights,
    stack,
    write_run,
)

from distci.judge import coverage, gate
from distci.publish import export
from distci.publish.gate import main as gate_main
from distci.errors import SelectionError
from distci.judge.ingest import ingest
from distci.judge.store import Store
from distci.matrix import load_matrix

NOW = datetime.now(timezone.utc).replace(microsecond=0)
T0 = NOW - timedelta(days=1, hours=2)  # night 2 started two hours ago: fresh
RELEASE = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
CANDIDATE = "cpu-cpu-torch_test2.15.0-ao_0.18.0-ws2-fix_on"
CUDA = "cuda-cu130-torch_2.14.1-ao_0.18.0-ws2-fix_on"
TP = "suites/test_tp.py::test_tp_loss_matches_reference[colwise-rowwise]"
F8 = "suites/test_float8.py::test_float8_tp_grads[rowwise]"
WAIT = "suites/regressions/test_pytorch125932_rowwise_parallel_wait.py::test_rowwise_output_wait_compiled"
ASYNC = "suites/test_async_tp.py::test_async_tp_fused_ops[float8-full-ac]"

OLD = stack("2.13.0+cpu", "449b1768410104d3ed79d3bcfe4ba1d65c7f22c0")
NEW = stack("2.13.1+cpu", "9b3a4c1f2e7d8a6b5c4d3e2f1a0b9c8d7e6f5a4b")

MATRIX_HEAD = """\
schema = 1

[defaults]
tiers = ["release"]

[accelerators.cpu]
backend = "gloo"
runner = ["ubuntu-latest"]
archs = ["x86_64"]
variants = ["cpu"]

[accelerators.cuda]
backend = "nccl"
runner = ["gpu-2"]
archs = ["x86_64"]
variants = ["cu130"]

[tiers.nightly]
blocking_suites = []
"""

ONE_CELL = MATRIX_HEAD + """
[[matrix]]
accelerator = "cpu"
torch = "2.13.0"
torchao = "0.18.0"

[tiers.release]
blocking_suites = ["suites"]
"""

MATRIX = MATRIX_HEAD + """
[[matrix]]
accelerator = "cpu"
torch = ["2.13.0", "test:2.15.0"]
torchao = "0.18.0"

[[matrix]]
accelerator = "cuda"
torch = "2.14.1"
torchao = "0.18.0"

[tiers.release]
blocking_suites = ["suites/test_tp.py", "suites/regressions"]
"""


def failed(test: str, message: str = "AssertionError: loss mismatch 0.0123 > 1e-05", kind: str = "assert") -> dict:
    return {"test_id": test, "outcome": "failed", "failure_kind": kind, "message": message}


def matrix_file(root: Path, text: str = ONE_CELL) -> Path:
    path = root / "matrix.toml"
    path.write_text(text)
    return path


def two_nights(root: Path, night2: list[dict], night1: list[dict] | None = None) -> Path:
    """A release cell: night 1 (torch 2.13.0), night 2 (torch 2.13.1); returns the store."""
    night1 = night1 or [{"test_id": t} for t in (TP, F8, WAIT, ASYNC)]
    write_run(root / "runs", "n1", RELEASE, night1, started_at=T0, stack=OLD, tier="release")
    write_run(root / "runs", "n2", RELEASE, night2, started_at=T0 + timedelta(days=1), stack=NEW, tier="release")
    db = root / "store.sqlite"
    ingest([root / "runs"], db)
    return db


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests read whole ids and lines in the gate's output; the one about the width sets its own."""
    monkeypatch.setenv("COLUMNS", "1000")


def cli(db: Path, matrix: Path, *args: str) -> int:
    return gate_main(["--tier", "release", "--store", str(db), "--matrix", str(matrix), *args])


def test_green_then_red_blocks_and_lists_the_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = two_nights(
        tmp_path,
        night1=[
            {"test_id": TP},
            failed(WAIT, "AttributeError: 'FunctionalTensor' object has no attribute 'wait'", "exception"),
            {"test_id": ASYNC},
            {"test_id": F8},
        ],
        night2=[
            failed(TP),
            {"test_id": WAIT},
            failed(ASYNC, "NCCL error: unhandled system error", "infra"),
            {"test_id": F8},
        ],
    )
    matrix = matrix_file(tmp_path)
    with Store(db) as s:
        result = gate.evaluate(s, "release", matrix_path=matrix)
    assert result.status == "BLOCKED" and not result.ok
    assert [(i.test_id, i.verdict) for i in result.blocking] == [(TP, "regression")]
    assert [(i.test_id, i.verdict) for i in result.warnings] == [(ASYNC, "infra")]
    assert [(i.test_id, i.verdict) for i in result.fixed] == [(WAIT, "fixed")]

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert cli(db, matrix) == gate.EXIT_CODES["BLOCKED"] == 1
    text = summary.read_text()
    assert "gate blocked" in text and TP in text and "Warnings" in text and ASYNC in text


def test_fixed_and_infra_do_not_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    db = two_nights(
        tmp_path,
        night1=[{"test_id": TP}, failed(WAIT), {"test_id": F8}],
        night2=[{"test_id": TP}, {"test_id": WAIT}, failed(F8, "InfraError: device lost", "infra")],
    )
    # F8 did not run on the current stack (its only result there is infra): not blocking, not PASSED
    assert cli(db, matrix_file(tmp_path)) == 3
    out = capsys.readouterr().out
    assert "INCOMPLETE" in out and f"missing: {F8}" in out and "[infra]" in out
    # a one-test rerun of F8 on the same stack completes the evidence
    write_run(tmp_path / "runs", "n3", RELEASE, [{"test_id": F8}], started_at=T0 + timedelta(days=1, hours=1),
              stack=NEW, tier="release", selection=[F8])
    ingest([tmp_path / "runs"], db)
    assert cli(db, matrix_file(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and f"fixed: [fixed] {RELEASE}\n      {WAIT}" in out and "[infra]" not in out
    # each cell's last run time, torch version and git hash
    assert f"cell {RELEASE}: ok  last run " in out and "torch 2.13.1+cpu" in out and NEW["torch_git"] in out


def test_only_release_blocking_suites_block(tmp_path: Path) -> None:
    db = two_nights(tmp_path, night2=[{"test_id": TP}, failed(F8), {"test_id": WAIT}, {"test_id": ASYNC}])
    matrix = matrix_file(tmp_path, MATRIX)
    suites = list(load_matrix(matrix).tiers["release"].blocking_suites)
    assert suites == ["suites/test_tp.py", "suites/regressions"]
    assert load_matrix(matrix).tiers["nightly"].blocking_suites == ()
    with Store(db) as s:
        result = gate.evaluate_cells(s, "release", [RELEASE], blocking_suites=suites)
        assert result.ok and [i.test_id for i in result.not_blocking] == [F8]
        assert gate.evaluate_cells(s, "release", [RELEASE], blocking_suites=["suites"]).status == "BLOCKED"
        assert gate.evaluate_cells(s, "release", [RELEASE], blocking_suites=None).status == "BLOCKED"
    assert cli(db, matrix_file(tmp_path)) == 1  # ONE_CELL: every suite blocks


def test_the_gate_knows_which_cells_should_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Missing, infra-only, stale and in-flight cells make the gate INCOMPLETE (exit 3),
    never PASSED; a waiver by name (with its reason, printed) accepts one."""
    db = two_nights(tmp_path, night2=[{"test_id": TP}, {"test_id": WAIT}])
    matrix = matrix_file(tmp_path, MATRIX)
    infra = [{"test_id": "<infra>::" + CANDIDATE, "outcome": "error", "failure_kind": "infra",
              "error_signature": "InfraError: cell needs cuda; this runner has none"}]
    write_run(tmp_path / "runs", "rc", CANDIDATE, infra, started_at=NOW - timedelta(hours=1), stack={}, tier="release")
    ingest([tmp_path / "runs"], db)
    with Store(db) as s:
        result = gate.evaluate(s, "release", matrix_path=matrix, now=NOW)
        states = {c.cell_id: c.state for c in result.cells}
        assert result.status == "INCOMPLETE" and not result.blocking
        assert states == {RELEASE: "ok", CANDIDATE: "infra_only", CUDA: "missing"}
        assert {c.cell_id: c.reason for c in result.cells}[CANDIDATE] == infra[0]["error_signature"]
        ok = {c.cell_id: c for c in result.cells}[RELEASE]
        assert ok.torch_version == NEW["torch"] and ok.torch_git == NEW["torch_git"] and ok.last_run.run_id == "n2"
        assert 2 * 3600 - 60 < ok.age_s < 2 * 3600 + 60

        later = gate.evaluate(s, "release", matrix_path=matrix, now=NOW + timedelta(hours=35))
        assert {c.cell_id: c.state for c in later.cells}[RELEASE] == "stale"
        longer = gate.evaluate(s, "release", matrix_path=matrix, now=NOW + timedelta(hours=35),
                               max_age=timedelta(hours=48))
        assert {c.cell_id: c.state for c in longer.cells}[RELEASE] == "ok"

        waived = gate.evaluate(s, "release", matrix_path=matrix, now=NOW,
                               waivers={CANDIDATE: "rc wheels not published yet", CUDA: "no GPU runner this week"})
        assert waived.status == "PASSED" and {c.state for c in waived.cells} == {"ok", "waived"}
        with pytest.raises(SelectionError, match="did you mean"):
            gate.evaluate(s, "release", matrix_path=matrix, waivers={CUDA[:-1]: "typo"})

    assert cli(db, matrix) == gate.EXIT_CODES["INCOMPLETE"] == 3
    out = capsys.readouterr().out
    assert out.startswith("gate INCOMPLETE") and f"incomplete: {CUDA} is missing" in out
    assert cli(db, matrix, "--waive", CUDA, "--reason", "no GPU runner", "--waive", CANDIDATE, "--reason", "rc") == 0
    out = capsys.readouterr().out
    assert f"waived: {CUDA}: no GPU runner" in out and out.startswith("gate PASSED")
    assert cli(db, matrix, "--waive", CUDA) == 2  # a waiver needs its reason
    assert cli(db, matrix, "--max-age", "1h") == 3

    # a run that has not ended (run.json without ended_at) is in flight
    run_json = tmp_path / "runs" / "rc" / "run.json"
    data = json.loads(run_json.read_text())
    data["ended_at"] = ""
    run_json.write_text(json.dumps(data))
    ingest([tmp_path / "runs"], db)
    with Store(db) as s:
        states = {c.cell_id: c.state for c in gate.evaluate(s, "release", matrix_path=matrix, now=NOW).cells}
    assert states[CANDIDATE] == "in_flight"


def test_a_one_test_rerun_of_another_test_never_hides_a_failure(tmp_path: Path) -> None:
    """Issue 28's false green: a failing full run, then a one-test rerun of ANOTHER test
    stays BLOCKED; a rerun of the failing test that now passes gives PASSED only when every
    other expected test has a result on the same stack."""
    runs, db, matrix = tmp_path / "runs", tmp_path / "store.sqlite", matrix_file(tmp_path)
    full = [{"test_id": TP}, failed(F8), {"test_id": WAIT}]
    write_run(runs, "full", RELEASE, full, started_at=T0 + timedelta(days=1), stack=NEW, tier="release")
    write_run(runs, "other", RELEASE, [{"test_id": TP}], started_at=T0 + timedelta(days=1, hours=1), stack=NEW,
              tier="release", selection=[TP])
    ingest([runs], db)
    assert cli(db, matrix) == 1
    with Store(db) as s:
        result = gate.evaluate(s, "release", matrix_path=matrix, now=NOW)
    assert [(i.test_id, i.run_id) for i in result.blocking] == [(F8, "full")]
    assert result.cells[0].evidence_runs == ["full", "other"]

    # the failing test passes on a rerun, but on a new stack: the others never ran there
    write_run(runs, "newstack", RELEASE, [{"test_id": F8}], started_at=T0 + timedelta(days=1, hours=2),
              stack=stack("2.13.2+cpu", "0" * 40), tier="release", selection=[F8])
    ingest([runs], db)
    assert cli(db, matrix) == 3
    with Store(db) as s:
        cell = gate.evaluate(s, "release", matrix_path=matrix, now=NOW).cells[0]
    assert cell.state == "partial" and cell.missing_tests == sorted([TP, WAIT])

    # the same rerun on the stack every other test has a result on: PASSED
    write_run(runs, "samestack", RELEASE, [{"test_id": F8}], started_at=T0 + timedelta(days=1, hours=3),
              stack=NEW, tier="release", selection=[F8])
    (runs / "newstack").rename(tmp_path / "newstack-gone")
    db.unlink()
    ingest([runs], db)
    assert cli(db, matrix) == 0


def test_markdown_names_missing_tests_and_a_narrowed_run_is_neutral_on_hud(tmp_path: Path) -> None:
    """The step summary lists what is missing (a backtick in an id cannot end its code span);
    the HUD row of a narrowed rerun with nothing blocking is `neutral`, never `success`."""
    odd = "suites/test_tp.py::test_x[a`b]"
    runs, db, matrix = tmp_path / "runs", tmp_path / "store.sqlite", matrix_file(tmp_path)
    write_run(runs, "full", RELEASE, [{"test_id": TP}, {"test_id": odd}], started_at=T0 + timedelta(days=1),
              stack=OLD, tier="release")
    write_run(runs, "rerun", RELEASE, [{"test_id": TP}], started_at=T0 + timedelta(days=1, hours=1), stack=NEW,
              tier="release", selection=[TP])
    ingest([runs], db)
    with Store(db) as s:
        md = gate.evaluate(s, "release", matrix_path=matrix, now=NOW).to_markdown()
        rows = {r.distci["run_id"]: r for r in export.hud_rows(s)}
    assert f"Missing on the current stack of `{RELEASE}` (1):" in md and "- ``suites/test_tp.py::test_x[a`b]``" in md
    assert rows["full"].conclusion == "success" and rows["rerun"].conclusion == "neutral"
    assert rows["rerun"].distci["selection"] == [TP]
    assert gate.md_code("`x") == "`` `x ``" and gate.md_code("plain") == "`plain`"


def test_a_narrowed_run_alone_is_not_a_complete_cell(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a complete run of the tier the expected tests are unknown: partial, never PASSED;
    a test a later narrowed run added is expected too, and a failure there blocks."""
    runs, db, matrix = tmp_path / "runs", tmp_path / "store.sqlite", matrix_file(tmp_path)
    write_run(runs, "k", RELEASE, [{"test_id": TP}], started_at=T0 + timedelta(days=1), stack=NEW, tier="release",
              selection=["-k tp"])
    write_run(runs, "pr", RELEASE, [{"test_id": TP}], started_at=T0 + timedelta(days=1), stack=NEW, tier="pr")
    ingest([runs], db)
    assert cli(db, matrix) == 3
    assert "no complete run of tier 'release'" in capsys.readouterr().out
    write_run(runs, "full", RELEASE, [{"test_id": TP}], started_at=T0 + timedelta(days=1, hours=1), stack=NEW,
              tier="release")
    write_run(runs, "new", RELEASE, [failed(WAIT)], started_at=T0 + timedelta(days=1, hours=2), stack=NEW,
              tier="release", selection=[WAIT])
    ingest([runs], db)
    assert cli(db, matrix) == 1


def test_shards_of_a_tier_join_into_one_complete_run(tmp_path: Path) -> None:
    """A tier run as N shard jobs: once every share 1..N has ended, their tests together are
    the expected ones (a failure in either blocks); shares of another N never join; a
    shard's share of tests missing from the latest set leaves the cell partial."""
    runs, db, matrix = tmp_path / "runs", tmp_path / "store.sqlite", matrix_file(tmp_path)
    day = T0 + timedelta(days=1)
    write_run(runs, "s1", RELEASE, [{"test_id": TP}, {"test_id": WAIT}], started_at=day, stack=NEW, tier="release",
              selection=["--shard 1/2"])
    ingest([runs], db)
    assert cli(db, matrix) == 3  # half a tier: the expected tests are unknown
    write_run(runs, "t2", RELEASE, [{"test_id": ASYNC}], started_at=day, stack=NEW, tier="release",
              selection=["--shard 2/3"])  # a share of another split
    ingest([runs], db)
    assert cli(db, matrix) == 3
    write_run(runs, "s2", RELEASE, [failed(F8)], started_at=day + timedelta(minutes=5), stack=NEW, tier="release",
              selection=["--shard 2/2"])
    ingest([runs], db)
    assert cli(db, matrix) == 1
    with Store(db) as s:
        result = gate.evaluate(s, "release", matrix_path=matrix, now=NOW)
    assert [(i.test_id, i.run_id) for i in result.blocking] == [(F8, "s2")]
    assert result.cells[0].evidence_runs[0] == "s1"
    # the failing share reruns and passes: PASSED on the two shards' tests together
    write_run(runs, "s2b", RELEASE, [{"test_id": F8}], started_at=day + timedelta(hours=1), stack=NEW, tier="release",
              selection=["--shard 2/2"])
    ingest([runs], db)
    assert cli(db, matrix) == 0
    # the next night's first share alone on a new stack: its other share's tests are missing
    write_run(runs, "n1", RELEASE, [{"test_id": TP}, {"test_id": WAIT}], started_at=day + timedelta(hours=2),
              stack=stack("2.13.2+cpu", "1" * 40), tier="release", selection=["--shard 1/2"])
    ingest([runs], db)
    with Store(db) as s:
        cell = gate.evaluate(s, "release", matrix_path=matrix, now=NOW).cells[0]
    assert cell.state == "partial" and cell.missing_tests == [F8]  # not ASYNC: its split never completed


def test_shard_text_is_checked_and_recorded() -> None:
    from distci.rundir import Selection, parse_shard

    def share(words):
        return Selection.from_list(words).share

    assert parse_shard("2/3") == (2, 3) and Selection(shard="2/3").to_list() == ["--shard 2/3"]
    assert share(["--shard 2/3"]) == (2, 3) and share(["--shard 2/3", "--resume r1"]) == (2, 3)
    assert share(["-k tp", "--shard 1/2"]) is None and share([]) is None and share(["--shard x"]) is None
    assert Selection.from_list(["--shard x"]).narrowed and not Selection.from_list(["--resume r1"]).narrowed
    full = Selection("tp and not f8", ("a.py::t[1]", "b.py::t"), "1/2", ("r1", "r2"))
    assert full.to_list() == ["-k tp and not f8", "a.py::t[1]", "b.py::t", "--shard 1/2", "--resume r1", "--resume r2"]
    assert Selection.from_list(full.to_list()) == full
    for bad in ("0/2", "3/2", "1", "a/b", "1/0"):
        with pytest.raises(ValueError, match="K/N"):
            parse_shard(bad)


@pytest.mark.parametrize("text, hours", [("36h", 36), ("90m", 1.5), ("2d", 48), ("3600s", 1), ("12", 12)])
def test_max_age_durations(text: str, hours: float) -> None:
    assert coverage.parse_duration(text) == timedelta(hours=hours)


@pytest.mark.parametrize(
    "suite, inside",
    [
        ("suites", True),
        ("suites/", True),
        ("suites/test_float8.py", True),
        ("float8", True),
        ("suites/regressions", False),
        ("tp", False),
        ("suites/test_float", False),
    ],
)
def test_in_suite(suite: str, inside: bool) -> None:
    assert gate.in_suite(F8, suite) is inside


def test_release_candidate_is_judged_against_its_baseline(tmp_path: Path) -> None:
    write_run(
        tmp_path / "runs", "rel", RELEASE, [{"test_id": TP}, {"test_id": F8}], started_at=T0, stack=OLD, tier="release"
    )
    write_run(
        tmp_path / "runs",
        "rc1",
        CANDIDATE,
        [failed(TP), {"test_id": F8}],
        started_at=T0 + timedelta(hours=3),
        stack=stack("2.15.0", "1f0e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"),
        tier="release",
        baseline_cell=RELEASE,
    )
    db = tmp_path / "store.sqlite"
    ingest([tmp_path / "runs"], db)
    matrix = matrix_file(tmp_path, MATRIX)
    with Store(db) as s:
        result = gate.evaluate_candidate(s, "torch_test", matrix_path=matrix)
        assert [r.cell_id for r in result.runs] == [CANDIDATE]
        assert [(i.test_id, i.verdict) for i in result.blocking] == [(TP, "regression")]
        with pytest.raises(SelectionError, match="torch_nope"):
            gate.evaluate_candidate(s, "torch_nope", matrix_path=matrix)
    assert gate_main(["--candidate", CANDIDATE, "--store", str(db), "--matrix", str(matrix)]) == 1
    assert gate_main(["--candidate", "torch_nope", "--store", str(db), "--matrix", str(matrix)]) == 2


def test_hud_rows_carry_the_relay_inputs_and_triage(tmp_path: Path) -> None:
    seeded = seed_nights(tmp_path / "runs", nights=4)
    db = tmp_path / "store.sqlite"
    ingest([seeded.root], db)
    last = seeded.nights[-1]
    with Store(db) as s:
        rows = export.hud_rows(s)
        by_run = {r.distci["run_id"]: r for r in rows}
        reg = by_run[seeded.run_ids[(last, NIGHTLY_OFF)]]
        prev = s.run(seeded.run_ids[(seeded.nights[-2], NIGHTLY_OFF)])
        now = s.run(reg.distci["run_id"])
    assert len(rows) == 20
    assert reg.delivery_id == now.torch_git != prev.torch_git and reg.event_type == "nightly"
    assert reg.job_name == NIGHTLY_OFF and reg.conclusion == "failure"
    assert reg.triage_verdict["category"] == "upstream"
    assert prev.torch_git[:12] in reg.triage_verdict["summary"]
    assert [d["name"] for d in reg.failed_tests_detail] == [REG_TANGENT.rpartition("::")[2]]
    assert reg.test_results["failed"] == 1 and reg.test_results["verdicts"]["regression"] == 1

    still = by_run[seeded.run_ids[(seeded.nights[-2], NIGHTLY_OFF)]]  # REG_F8_AC: green, red, red (now), fixed
    assert (
        still.conclusion == "failure"
        and still.category == "upstream"
        and "failing since" in still.triage_verdict["summary"]
    )

    npu = by_run[seeded.run_ids[(last, RELEASE_NPU)]]
    assert npu.conclusion == "neutral" and npu.category == "infra"
    assert npu.triage_verdict["evidence"][0]["test"] == INFRA + RELEASE_NPU
    flaky = by_run[seeded.run_ids[(last, NIGHTLY_ON)]]
    assert flaky.conclusion == "success" and flaky.category == "flake"
    # a known issue is counted the way the gate counts it: `known`, never `failed` under a green conclusion
    known = by_run[seeded.run_ids[(last, RELEASE_CUDA)]]
    assert known.conclusion == "success" and known.test_results["verdicts"].get("xfail") == 1
    assert known.test_results["failed"] == 0 and known.test_results["known"] == 1
    assert known.failed_tests_detail == []
    assert export.sha_verdicts(rows)[reg.delivery_id] == "upstream"

    partial = {"partial": True, "python": "3.11.11", "error": "no NPU visible"}
    broken = [{"test_id": INFRA + RELEASE_NPU, "outcome": "error", "failure_kind": "infra", "message": "InfraError: x"}]
    write_run(seeded.root, "npu-later", RELEASE_NPU, broken, started_at=T0 + timedelta(days=9), stack=partial)
    ingest([seeded.root], db)
    left_out: list[str] = []
    with Store(db) as s:
        assert len(export.hud_rows(s, left_out=left_out)) == 20 and left_out == ["npu-later"]

    out = export.write_rows(rows, tmp_path / "hud.jsonl")
    first = json.loads(out.read_text().splitlines()[0])
    assert {
        "delivery_id",
        "event_type",
        "conclusion",
        "job_name",
        "test_results",
        "failed_tests_detail",
        "triage_verdict",
    } <= first.keys()
    assert export.main(["--hud", "--store", str(db), "--out", str(tmp_path / "hud.json"), "--format", "json"]) == 0
    assert len(json.loads((tmp_path / "hud.json").read_text())) == 20


def _interrupted(test: str) -> dict:
    return {"test_id": test, "outcome": "error", "failure_kind": "infra",
            "error_signature": "Interrupted: stopped by SIGINT",
            "message": "Interrupted: the run was stopped (SIGINT) during this test, before it finished"}


def test_a_run_stopped_part_way_defines_no_expected_tests(tmp_path: Path) -> None:
    """A run stopped by SIGINT holds rows only for the tests it reached: taken as the
    cell's complete run, the tests after the one in flight would drop out of what is
    expected, and rerunning that one test (its printed repro) would turn the gate green
    with the rest of the tier never run on this stack. Only `--resume` completes it."""
    runs, db, matrix = tmp_path / "runs", tmp_path / "store.sqlite", matrix_file(tmp_path)
    write_run(runs, "night1", RELEASE, [{"test_id": TP}, {"test_id": WAIT}, {"test_id": F8}], started_at=T0,
              stack=OLD, tier="release")
    day = T0 + timedelta(days=1)
    write_run(runs, "stopped", RELEASE, [{"test_id": TP}, _interrupted(WAIT)], started_at=day, stack=NEW,
              tier="release")
    ingest([runs], db)
    assert cli(db, matrix) == 3
    write_run(runs, "repro", RELEASE, [{"test_id": WAIT}], started_at=day + timedelta(minutes=30), stack=NEW,
              tier="release", selection=[WAIT])
    ingest([runs], db)
    with Store(db) as s:
        cell = gate.evaluate(s, "release", matrix_path=matrix, now=NOW).cells[0]
    assert cell.state == "partial" and cell.missing_tests == [F8]
    write_run(runs, "resumed", RELEASE, [{"test_id": F8}], started_at=day + timedelta(hours=1), stack=NEW,
              tier="release", selection=["--resume stopped"])
    ingest([runs], db)
    assert cli(db, matrix) == 0
    with Store(db) as s:
        cell = gate.evaluate(s, "release", matrix_path=matrix, now=NOW).cells[0]
    assert cell.evidence_runs[0] == "stopped"


def test_a_stopped_share_completes_through_the_run_that_resumes_it(tmp_path: Path) -> None:
    runs, db, matrix = tmp_path / "runs", tmp_path / "store.sqlite", matrix_file(tmp_path)
    day = T0 + timedelta(days=1)
    write_run(runs, "s1", RELEASE, [{"test_id": TP}, _interrupted(WAIT)], started_at=day, stack=NEW, tier="release",
              selection=["--shard 1/2"])
    write_run(runs, "s2", RELEASE, [{"test_id": F8}], started_at=day, stack=NEW, tier="release",
              selection=["--shard 2/2"])
    ingest([runs], db)
    assert cli(db, matrix) == 3  # share 1 stopped part-way: the tier's tests are not known
    write_run(runs, "s1r", RELEASE, [failed(WAIT)], started_at=day + timedelta(hours=1), stack=NEW, tier="release",
              selection=["--shard 1/2", "--resume s1"])
    ingest([runs], db)
    assert cli(db, matrix) == 1  # complete now, and the resumed test's failure blocks
    with Store(db) as s:
        result = gate.evaluate(s, "release", matrix_path=matrix, now=NOW)
    assert [(i.test_id, i.run_id) for i in result.blocking] == [(WAIT, "s1r")]
    # a run resuming one the store does not hold completes nothing
    write_run(runs, "s1x", RELEASE, [{"test_id": WAIT}], started_at=day + timedelta(hours=2), stack=NEW,
              tier="release", selection=["--shard 1/2", "--resume elsewhere"])
    ingest([runs], db)
    with Store(db) as s:
        result = gate.evaluate(s, "release", matrix_path=matrix, now=NOW)
    assert result.cells[0].state == "ok" and result.cells[0].evidence_runs[0] == "s1"


def test_every_gate_line_fits_the_terminal_and_its_repro_stays_pasteable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    db = two_nights(tmp_path, night2=[failed(TP), {"test_id": WAIT}, {"test_id": ASYNC}, {"test_id": F8}])
    assert cli(db, matrix_file(tmp_path)) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines and max(map(len, lines)) <= 80, [line for line in lines if len(line) > 80]
    with Store(db) as s:
        result = gate.evaluate(s, "release", matrix_path=matrix_file(tmp_path))
        gate.explain_blocking(s, result)
        repro = result.blocking[0].repro
    assert repro, "a blocker carries its repro (else this test proves nothing)"
    start = next(i for i, line in enumerate(lines) if line.strip() == "repro:")
    command, i = lines[start + 1], start + 1
    while command.endswith("\\"):  # the shell drops backslash-newline: what follows continues the line
        i += 1
        command = command[:-1] + lines[i]
    assert shlex.split(command) == shlex.split(repro), "the wrapped repro pastes as the same command"
