"""The ops generator: its drawing and shrinking (quick, no torch), its sweep loop against a fake
cell (quick), and each planted DTensor bug found and shrunk end to end on gloo ranks (slow).

The slow tests run `python -m distci fuzz --generator ops` for real on this interpreter's
stack with one bug of suites/generators/ops_plants.py planted, the draw narrowed to the ops
the plant lives in (each plant needs an op, a placement and, for one, a size: what the
shrunk case must keep) and to the 1-D mesh of 2 (a 4-rank pool costs more than the rest
of the test on 2 cores; shrinking a 2x2 or 4 mesh down is a quick test below).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from distci.op_case import CaseIdError, MESHES, OpCase, parse_case
from distci.stack import Stack
from distci.op_inventory import INVENTORY
from distci.fuzz.ops import draw_case, draw_cases
from distci.op_shrink import shrink, simpler, valid
from distci.fuzz.ops_command import Sweeps, plan_size

REPO = Path(__file__).resolve().parents[1]
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"


def test_a_seed_draws_the_same_cases_and_another_seed_others():
    assert [c.id for c in draw_cases("a", 0, 50)] == [c.id for c in draw_cases("a", 0, 50)]
    assert [c.id for c in draw_cases("a", 0, 50)] != [c.id for c in draw_cases("b", 0, 50)]
    assert draw_case("a", 37).id == draw_cases("a", 30, 10)[7].id  # a case is its index's, not its batch's


def test_draws_cover_every_op_mesh_placement_and_the_awkward_sizes():
    cases = draw_cases("coverage", 0, 3000)
    assert {c.op for c in cases} == {s.name for s in INVENTORY}
    assert {c.mesh for c in cases} == set(MESHES)
    kinds = {re.sub(r"\d+", "d", p) for c in cases for pl in c.placements for p in pl}
    assert kinds == {"R", "Sd", "S-d", "Psum", "Pavg", "SSd"}
    sizes = {n for c in cases for s in c.shapes for n in s}
    assert {0, 1, 7, 13} <= sizes  # empty, size-1, and sizes neither mesh divides
    uneven = [c for c in cases if any(p.startswith("S") and not p.startswith("SS") and
                                      s[int(p[1:])] % MESHES[c.mesh][0][a] for s, pl in zip(c.shapes, c.placements)
                                      for a, p in enumerate(pl))]
    assert len(uneven) > 300
    for c in cases:
        assert valid(c), c.id
        assert parse_case(c.id).id == c.id


def test_a_case_id_names_the_case_and_a_bad_one_says_what_is_wrong():
    case = parse_case("linear~2x2~f32~3x7,5x7,5~S0.R,R.S-1,R.R~bias=1~11")
    assert case.world_size == 4 and case.param == {"bias": 1} and case.shapes[1] == (5, 7)
    for bad, part in [("linear~3~f32~3x7~R~-~1", "mesh"), ("linear~2~f64~3x7~R~-~1", "dtype"),
                      ("linear~2~f32~3x7~Q~-~1", "placement"), ("linear~2~f32~3x7", "7 parts")]:
        with pytest.raises(CaseIdError, match=part):
            parse_case(bad)


def _sharded_seven(case: OpCase) -> tuple[str | None, str]:
    """A fake bug: fails when a Shard sits on a dim of size 7 (whatever else the case holds)."""
    for shape, placement in zip(case.shapes, case.placements):
        for p in placement:
            if p.startswith("S") and not p.startswith("SS") and shape[int(p[1:])] == 7:
                return "local shape", "..."
    return None, ""


def test_shrinking_keeps_what_the_failure_needs_and_nothing_else():
    case = next(c for c in draw_cases("shrink", 0, 4000, [s for s in INVENTORY if s.name == "linear"])
                if c.mesh == "2x2" and c.dtype == "bf16" and _sharded_seven(c)[0] and c.seed
                and len(c.shapes[0]) == 3 and sum(p != "R" for pl in c.placements for p in pl) >= 3)
    done = shrink(case, "local shape", _sharded_seven)
    small = done.case
    assert done.complete and done.steps
    assert small.mesh == "2" and small.dtype == "f32" and small.seed == 0 and small.param == {"bias": 1}
    assert _sharded_seven(small)[0] == "local shape"
    assert sum(p != "R" for pl in small.placements for p in pl) == 1  # one Shard, of the 7
    assert sorted(n for s in small.shapes for n in s if n != 7) == [1] * len([n for s in small.shapes for n in s
                                                                              if n != 7])
    assert all(simpler_case.id != small.id and _sharded_seven(simpler_case)[0] is None
               for simpler_case in simpler(small))  # minimal: no one-step simplification keeps it


def test_every_simplification_is_a_valid_and_different_case():
    for case in draw_cases("simpler", 0, 150):
        for s in simpler(case):
            assert valid(s) and s.id != case.id, (case.id, s.id)
            assert s.world_size <= case.world_size
        # a case rebuilt from its id alone (a find's test id) shrinks the same way
        assert [s.id for s in simpler(parse_case(case.id))] == [s.id for s in simpler(case)]


def test_shrinking_stops_at_its_bound_and_says_so():
    case = next(c for c in draw_cases("bound", 0, 2000) if _sharded_seven(c)[0] and len(simpler(c)) > 5)
    done = shrink(case, "local shape", _sharded_seven, max_checks=2)
    assert not done.complete and done.checks == 2


def _fake_sweep(fail_on: dict[str, str], die_on: set[str] = frozenset()):
    def run(folder: Path, cases: list) -> list[dict]:
        """Each world size's sweep stops at its first case of a `die_on` op, as a dead pool does."""
        rows, dead = [], set()
        for c in cases:
            if c.op in die_on or c.world_size in dead:
                dead.add(c.world_size)
                continue
            sig = fail_on.get(c.op)
            rows.append({"id": c.id, "status": "fail" if sig else "pass", "signature": sig, "message": sig or "",
                         "seconds": 0.01})
        return rows
    return run


def test_sweeps_count_file_each_signature_once_and_requeue_after_a_dead_case(tmp_path):
    ticks = iter(range(0, 10_000, 5))
    sweeps = Sweeps("s", _fake_sweep({"cat": "cat: output 0: value"}, die_on={"sdpa"}), tmp_path,
                    clock=lambda: next(ticks), log=lambda m: None)
    report = sweeps.run(budget_s=1e9, max_cases=900)
    cats = [f for f in report.finds if f.signature == "cat: output 0: value"]
    assert len(cats) == 1 and report.repeats["cat: output 0: value"] >= 1
    died = [f for f in report.finds if "died" in f.signature]
    assert died and all(f.found.startswith("sdpa~") for f in died)
    assert len(died) == 1 and report.counts["lost"] >= 2  # one find, however many sweeps it killed
    assert report.drawn == 900 and report.cases >= 750


def test_a_sweep_is_sized_to_the_measured_rate():
    assert plan_size(0, 0.0, 300) == 300
    assert plan_size(100, 10.0, 300) == 3000
    assert plan_size(1, 100.0, 300) == 20 and plan_size(10**6, 1.0, 300) == 6000


def test_every_inventory_entry_has_a_call_and_names_where_trainers_call_it():
    pytest.importorskip("torch")
    from suites.generators.op_calls import CALLS

    assert {s.name for s in INVENTORY} == set(CALLS)
    assert all(s.where for s in INVENTORY)


def test_the_fuzz_command_lists_its_generators():
    from distci.cli import build_parser

    args = build_parser().parse_args(["fuzz", "--cell", CELL, "--generator", "ops", "--ops", "cat"])
    assert args.generator == "ops" and args.ops == "cat"
    assert build_parser().parse_args(["fuzz", "--cell", CELL]).generator == "configs"


PLANTS = {
    # plant: (ops drawn, the find's signature, what the shrunk case must keep, seed)
    "shard_shape": ("cat", "cat: output 0: local shape", lambda c: 7 in [n for s in c.shapes for n in s], "p1"),
    "avg_twice": ("sum,mean", ": output 0: value", lambda c: "Pavg" in c.placements[0], "p1"),
    "grad_drop": ("rms_norm", "rms_norm: gradient of input 0: value",
                  lambda c: any(p in ("S-1", f"S{len(c.shapes[0]) - 1}") for p in c.placements[0]), "p1"),
    # the `use=first` form: only a case whose loss leaves an output unread meets it
    "unread_ones": ("split,chunk,unbind", ": gradient of input 0: value", lambda c: c.param.get("use") == "first",
                    "p1"),
    # the random judge (suites/generators/ops_random.py): the mask in the backward, replicas alike
    "mask_redrawn": ("dropout_train", "dropout_train: gradient of input 0: mask",
                     lambda c: any(p.startswith("S") for p in c.placements[0]), "p1"),
    "replica_drift": ("rand_like,init_", ": output 0: replicas", lambda c: c.placements[0] == ("R",), "p1"),
    # under loss_parallel() (OpSpec.context): only the mean over a batch with ignored tokens meets it
    "lp_ignore_mean": ("lp_cross_entropy", "lp_cross_entropy: output 0: value",
                       lambda c: c.param["reduction"] == "mean" and c.placements[0] == ("S-1",), "p1"),
}


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_op_bug_is_found_and_shrunk(tmp_path, plant):
    pytest.importorskip("torch")
    from distci.harness import procs

    ops, signature, keeps, seed = PLANTS[plant]
    env = {**os.environ, "DISTCI_OPS_PLANT": plant}
    cmd = [sys.executable, "-m", "distci", "fuzz", "--generator", "ops", "--cell", CELL, "--python", sys.executable,
           "--runs-root", str(tmp_path / "runs"), "--seed", seed, "--ops", ops, "--meshes", "2",
           "--max-cases", "40", "--budget", "5m", "--report", str(tmp_path / "report.md")]
    child = procs.start_owned(cmd, env=env, token=procs.run_token(), death_signal=signal.SIGTERM, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = child.communicate(timeout=600)
    finally:
        if child.poll() is None:
            procs.stop(child)
    report = json.loads(next((tmp_path / "runs").glob("*/fuzz/ops-report.json")).read_text())
    finds = [f for f in report["finds"] if signature in f["signature"]]
    assert finds, out[-3000:]
    find = finds[0]
    small = parse_case(find["shrunk"])
    assert keeps(small), find
    assert small.seed == 0 and small.dtype == "f32" and find["steps"] >= 1, find
    assert find["outcome"] == "failed" and find["new"]  # replayed as its own Result, unexplained
    assert child.returncode == 1
    results = [json.loads(line) for line in next((tmp_path / "runs").glob("*/results.jsonl")).read_text().splitlines()]
    replay = next(r for r in results if r["test_id"] == find["test_id"])
    assert replay["outcome"] == "failed" and signature.strip(": ") in replay["message"]
    assert find["shrunk"] in (tmp_path / "report.md").read_text()


def test_a_find_is_judged_as_a_fuzz_result_never_expected():
    from distci.fuzz.ops_command import ENTRY, case_test_id
    from distci.judge.rows import GENERATOR_TESTS, is_fuzz

    assert ENTRY.startswith(GENERATOR_TESTS)
    assert is_fuzz(case_test_id("cat~2~f32~1x7,1x7~R,S1~dim=0~0"))


def test_the_engine_imports_without_torch():
    code = ("import sys, distci.fuzz.ops, distci.fuzz.ops_command, distci.fuzz.ops_report; "
            "assert 'torch' not in sys.modules, 'the ops engine imported torch'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


@pytest.fixture(scope="module")
def ops_session(tmp_path_factory):
    """One pytest session of the ops entry on real gloo ranks, as a fuzz run holds one
    (distci/fuzz/ops_command.py): the slow tests below hand it their sweeps and cases as
    batches (`_sweep`, `_one_case`), so pytest and the 2- and 4-rank pools start once for all
    of them. DISTCI_OPS_PLANT=spin for the whole session (the ranks read it when their pool
    starts): it touches sigmoid, gelu and softmax (and silu after softmax, on the same ranks);
    the other tests' cases use none of them."""
    pytest.importorskip("torch")
    from distci.matrix import load_matrix
    from distci.run.batches import BatchSession
    from distci.run.cellrun import start_run
    from distci.fuzz.ops_command import SWEEP

    cell = next(c for c in load_matrix(REPO / "matrix.toml").cells if c.id == CELL)
    root = tmp_path_factory.mktemp("ops-session")
    info, run_dir = start_run(cell, root / "runs", tier="pr", log=lambda m: None)
    lines: list[str] = []
    session = BatchSession(cell, Path(sys.executable), info, run_dir, entry_test=SWEEP,
                           extra_args=["--distci-reruns=0"], directory=run_dir / "sessions", log=lines.append)
    yield session
    session.close()


def _log_tail(session) -> str:
    from distci.rundir import RunDir

    log = RunDir(session.run_dir).pytest_log
    return log.read_text()[-4000:] if log.exists() else ""


def _sweep(session, folder: Path, cases: list[str], **bounds) -> dict[str, dict]:
    """One sweep of `cases` in the shared session, as the fuzz run sends one: its rows by case
    (the first of each, should a slot have written one twice)."""
    from distci.fuzz.ops_command import CASES_ENV, SWEEP, read_outcomes

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "batch.json").write_text(json.dumps({
        "cases": [{"id": c, "extra": {}} for c in cases], "out": str(folder), "known_signatures": [], **bounds}))
    session.run({CASES_ENV: str(folder / "batch.json"), "DISTCI_OPS_PLANT": "spin"}, tests=[SWEEP])
    return {r["id"]: r for r in read_outcomes(folder)}


def _one_case(session, folder: Path, case: str) -> list[dict]:
    """`test_op_case[case]` in the shared session, as a fuzz run replays a find: its Results."""
    from distci.fuzz.ops_command import CASES_ENV, ENTRY
    from distci.rundir import RunDir

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "finds.json").write_text(json.dumps({"finds": [case], "out": str(folder)}))
    session.run({CASES_ENV: str(folder / "finds.json"), "DISTCI_OPS_PLANT": "spin"}, tests=[f"{ENTRY}::test_op_case"])
    return [r.to_dict() for r in RunDir(session.run_dir).results() if r.test_id.endswith(f"::test_op_case[{case}]")]


@pytest.mark.slow
def test_an_explicit_redistribute_refusal_is_a_gap_not_a_find(ops_session, tmp_path):
    """The night runs re-filed DTensor's "Please redistribute the input first" (a reshape that
    merges a sharded dim) as a new find every night: upstream names that limit. The case runs
    on two ranks through the harness and is counted as a gap (a skip naming the refusal)."""
    pytest.importorskip("torch")
    case = "reshape_merge~2~f32~1x1x1x2~S2~-~0"
    results = _one_case(ops_session, tmp_path, case)
    assert [r["outcome"] for r in results] == ["skipped"], _log_tail(ops_session)
    assert "refused, redistribute first" in results[0]["message"], results[0]["message"]


@pytest.mark.slow
def test_the_reference_runs_on_the_value_a_partial_input_holds(ops_session, tmp_path):
    """layer_norm over a one-element dim divides x - mean (pure rounding) by sqrt(eps): the
    night run's Partial(sum) case differed 2.6x the f32 threshold in the weight's gradient
    only because the shares sum to the drawn tensor up to an ulp. The judge now checks the
    inputs read back right and recomputes the reference on what they hold, so the case
    passes; a wrong Partial reduction of the result is still found (the avg_twice plant)."""
    pytest.importorskip("torch")
    case = "layer_norm~2~f32~1x1,1,1~Psum,R,R~-~909"
    results = _one_case(ops_session, tmp_path, case)
    assert [r["outcome"] for r in results] == ["passed"], _log_tail(ops_session)


class _Mesh:
    """A mesh's sizes, all `share_fractions` reads."""

    def __init__(self, *sizes: int) -> None:
        self.sizes = sizes

    def size(self, axis: int) -> int:
        return self.sizes[axis]


def test_a_partial_inputs_gradient_is_judged_against_the_op_with_its_cotangent_split_as_the_shares():
    """The bench's rms_norm_manual case (a 1-element norm times a Partial(sum) weight): its
    backward cancels two terms of ~1/|x|, so each rank's share rounds apart from the whole by 4x
    the f32 threshold. On one device, the ranks' computation (each share of the weight
    backpropagated, summed) is exactly the reference with its cotangent split in the same
    fractions, which the judge now accepts; a gradient off by a real amount matches neither."""
    pytest.importorskip("torch")
    import torch

    from suites.generators.op_calls import CALLS, Context
    from suites.generators.ops_cases import _compare, _cotangents, _loss, _split_cotangent_grads, full_inputs, \
        share_fractions

    case = parse_case("rms_norm_manual~2~f32~4x4x1,1~R,Psum~-~431")
    x, w = full_inputs(case, "cpu")
    fractions = share_fractions(case.placements[1], _Mesh(2))
    assert fractions == [0.375, 0.625] and share_fractions(("Psum", "Pavg"), _Mesh(2, 2)) == \
        [0.375 * 0.375, 0.375 * 0.625, 0.625 * 0.375, 0.625 * 0.625]
    call, like = CALLS[case.op], Context(lambda t, k: torch.zeros_like(t))

    def grad_of_x(weights):  # the ranks' backward: each weight share on its own, summed
        total = 0
        for weight in weights:
            refs = [x.clone().requires_grad_(), weight.clone()]
            out = call(refs, {}, like)
            _loss(out, _cotangents(case, out)).backward()
            total = total + refs[0].grad
        return total

    held = w * fractions[0] + w * fractions[1]
    ranks = grad_of_x([w * f for f in fractions])
    refs = [x.clone().requires_grad_(), held.clone().requires_grad_()]
    out = call(refs, {}, like)
    cotangents = _cotangents(case, out)
    _loss(out, cotangents).backward()
    assert "0.230843 vs 0.23085" in _compare("gradient of input 0", ranks, refs[0].grad, "f32", 16)  # the ranks' numbers
    split = _split_cotangent_grads(call, {}, refs, [True, True], cotangents, fractions, like)
    assert _compare("gradient of input 0", ranks, split[0], "f32", 16) is None
    wrong = ranks.clone()
    wrong[0, 0, 0] += 1e-4  # 50x the threshold: a real error, not the shares' rounding
    assert _compare("gradient of input 0", wrong, split[0], "f32", 16) is not None
    assert _compare("gradient of input 0", wrong, refs[0].grad, "f32", 16) is not None


@pytest.mark.slow
def test_a_partial_weights_rounding_through_a_cancelling_backward_is_not_a_find(ops_session, tmp_path):
    """The same case on two ranks through the harness: failed before the split reference
    ("rms_norm_manual: gradient of input 0: value", 4x the f32 threshold), passes now."""
    pytest.importorskip("torch")
    results = _one_case(ops_session, tmp_path, "rms_norm_manual~2~f32~4x4x1,1~R,Psum~-~431")
    assert [r["outcome"] for r in results] == ["passed"], _log_tail(ops_session)


# ---------------------------------------------------------------- a sweep that survives its cases

def test_a_case_that_hangs_some_ranks_is_a_find_naming_the_error_and_the_empty_shard_entry():
    """The lead's bench (and the night runs' o5): foreach_norm ord=inf with empty shards on
    ranks 2-3 raises there only and ranks 0-1 wait in the norm's all-reduce. The resume slot
    records the raising ranks' error as a hang find: dtensor-max-empty-shard's (the inf norm is
    its repro's second face), through another op that entry's near miss, never new and never
    "the sweep died"."""
    from distci.known_issues import load_registry
    from suites.generators.ops_sweep import dead_rows

    case = "foreach_norm~4~bf16~8x2,16~S-1,S-1~ord=inf~820"
    raised = {"status": "fail", "signature": "the op raised RuntimeError: _foreach_norm cannot compute the infinity "
              "norm on an empty tensor because the operation does not have an identity", "message": "...",
              "seconds": 0.01, "empty": True, "raised": True}
    stuck = [{"rank": r, "id": case, **raised} for r in (2, 3)]
    [row] = dead_rows({"id": case, "candidate": None}, stuck, 4)
    assert row["status"] == "fail" and "the others hang" in row["signature"]
    assert "_foreach_norm cannot compute the infinity norm" in row["signature"]
    assert "ranks [2, 3] finished the case, ranks [0, 1] never did" in row["message"]
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    test_id = f"suites/generators/ops_entry.py::test_op_case[{case}]"
    stack = Stack(torch="2.13.0")
    # the inf norm's face is the entry's (its repro's second test); through another op, a near miss
    assert registry.match(test_id, f"AssertionError: {row['signature']}", row["message"], stack) \
        == "dtensor-max-empty-shard"
    elsewhere = test_id.replace("foreach_norm~", "linear~")
    assert registry.match(elsewhere, f"AssertionError: {row['signature']}", row["message"], stack) is None
    assert registry.near_misses(elsewhere, f"AssertionError: {row['signature']}", row["message"],
                                stack) == ["dtensor-max-empty-shard"]
    # the same error on ranks whose shards are not empty says so, and names no entry
    [other] = dead_rows({"id": case, "candidate": None}, [{**s, "empty": False} for s in stuck], 4)
    assert "raised on some ranks only" in other["signature"]
    assert registry.near_misses(elsewhere, f"AssertionError: {other['signature']}", other["message"], stack) == []


def test_a_slot_that_died_shrinking_records_the_case_shrunk_so_far_and_the_candidate_apart():
    """The night runs' c4 (argmax~2~f32~1x2~S-1: it raises alike on every rank, yet its sweep
    died): shrinking it reaches 1x1, where rank 1's shard is empty; what ends the slot there is
    a candidate, and the next slot records the drawn case with its own failure, shrunk as far
    as it got, and the candidate's death as a find of its own."""
    from suites.generators.ops_sweep import dead_rows

    record = {"id": "argmax~2~f32~1x2~S-1~dim=-1~671", "status": "fail", "signature": "the op raised X",
              "message": "the op raised X", "seconds": 0.1}
    best = {"id": "argmax~2~f32~1x2~S-1~dim=-1~0", "message": "the op raised X (seed 0)"}
    flight = {"id": record["id"], "candidate": "argmax~2~f32~1x1~R~dim=-1~0", "record": record, "best": best}
    import time

    died, drawn = dead_rows(flight, [], 2)
    assert died["id"] == flight["candidate"] and died["status"] == "lost" and "sweep died" in died["signature"]
    held, _ = dead_rows({**flight, "started": time.time() - 301}, [], 2)  # the watchdog's 300 s passed
    assert held["signature"] == "argmax: no rank finished the case within 300s"
    assert drawn["id"] == record["id"] and drawn["signature"] == "the op raised X"
    assert drawn["shrunk"]["id"] == best["id"] and not drawn["shrunk"]["complete"]
    # out of step after the candidate ran (it was agreed): no find for it, the drawn case shrunk so far
    [only] = dead_rows({**flight, "probe": {"id": flight["candidate"], "status": "fail"}}, [], 2)
    assert only["id"] == record["id"] and "out of step" in only["shrunk"]["stopped"]
    # out of step after a drawn case: its agreed row, as it ran
    probe = {"id": record["id"], "status": "fail", "signature": "the op raised X"}
    assert dead_rows({"id": record["id"], "candidate": None, "probe": probe}, [], 2) == [probe]


def test_a_case_every_rank_stands_still_in_is_a_deadlock_found_by_the_pulses_never_a_slow_case(tmp_path):
    """The idle bench's index_add~2x2 (its ranks took different output placements, reports/fuzz-ops.md)
    held every rank in collectives that never pair: no rank at the agreement, the watchdog took
    300 s. Each rank's pulse says when it last issued a collective and last used CPU: every rank
    still for QUIET_S (+ the grace an agreement gets) inside a case ends the rank, its deadlock
    record names the group whose ranks parted; one rank still using CPU (a slow propagation, a
    spin its bound will cut), a rank settling its outcome, or no case in flight ends nothing."""
    import time

    from suites.generators import ops_sweep as sw

    files = sw.SweepFiles(tmp_path, 2)
    case = "index_add~2x2~f32~4x6,4,4x6~Psum.R,S0.S0,S-1.R~inplace=0~610"
    ended = []
    pulse = sw.Pulse(files, 0, 2, lambda: {"0,1": 6, "0,2": 8}, exit_rank=ended.append)
    now = time.time()
    still = now - sw.QUIET_S - sw.DEADLOCK_GRACE_S - 1

    def beat(rank: int, busy: float, counts: dict, settling: bool = False) -> None:
        sw._write(files.pulse_file(rank), {"counts": counts, "changed": still, "busy": busy, "at": now,
                                           "settling": settling})

    beat(0, still, {"0,1": 6, "0,2": 8})
    beat(1, now - 0.5, {"0,1": 6, "1,3": 9})  # rank 1 still computing
    files.begin(case)
    assert pulse.blocked_peer() is None
    pulse._end_if_deadlocked(now)
    assert not ended and files.deadlock() is None
    beat(1, still, {"0,1": 6, "1,3": 9}, settling=True)  # in the outcome's agreement: its own timeout decides
    pulse._end_if_deadlocked(now)
    assert not ended
    assert pulse.blocked_peer() == 1  # a rank at the raised-anywhere agreement gives up
    beat(1, still, {"0,1": 7, "1,3": 9})
    files.end()  # no case in flight (the pulse outlives cases by a little)
    pulse._end_if_deadlocked(now)
    assert not ended
    files.begin(case)
    pulse._end_if_deadlocked(now)
    assert ended and files.deadlock()["id"] == case
    # its last words: the deadlock's diagnosis, which a replayed case's Result carries
    assert ended[0].startswith("index_add: every rank waits in a collective its peers never issue (a deadlock)")
    assert "group [0,1]: ranks [0] issued 6, ranks [1] issued 7" in ended[0], ended[0]
    # the ranks it ends fail their peers' pending collectives: a stuck outcome filed after it is its consequence
    stuck = [{"rank": 0, "id": case, "status": "fail", "signature": "judge raised RuntimeError", "message": ""}]
    [row] = sw.dead_rows({"id": case, "candidate": None}, stuck, 4, files.deadlock())
    assert row["signature"] == "index_add: every rank waits in a collective its peers never issue (a deadlock)"
    assert "group [0,1]: ranks [0] issued 6, ranks [1] issued 7" in row["message"], row["message"]
    assert sw.dead_rows({"id": "other~2~f32~1~R~-~0", "candidate": None}, [], 4, files.deadlock())[0]["signature"] \
        == "other: the sweep died on this case"  # a record of another case says nothing about this one
    # what "busy" reads: the main thread's own CPU, read from the pulse's thread (waiting uses none)
    import threading

    def burn(clock, seconds: float) -> None:  # until `clock` advanced `seconds` (at most 60 s of wall)
        began, start = time.monotonic(), clock()
        while clock() - start < seconds and time.monotonic() - began < 60:
            pass

    cpu, got = sw._main_thread_cpu(), []
    reader = threading.Thread(target=lambda: [got.append(cpu()), burn(time.thread_time, 0.2), got.append(cpu())])
    reader.start()
    reader.join()  # the main thread waits while the other burns: its clock stands still
    burn(cpu, 0.2)
    assert got[1] - got[0] < 0.05 and cpu() - got[1] >= 0.2, (got, cpu())
    # and the beat itself: busy follows the main thread's CPU, not the wall clock
    beating = sw.Pulse(sw.SweepFiles(tmp_path / "beat", 1), 0, 1, lambda: {"0": 1})
    files.folder.joinpath("beat").mkdir()

    def busy(since: float) -> float:  # the beat's "busy" once a beat later than `since` wrote it
        for _ in range(200):
            beat = json.loads(beating.files.pulse_file(0).read_text()) if beating.files.pulse_file(0).exists() else {}
            if beat.get("at", 0) > since:
                return beat["busy"]
            time.sleep(0.05)
        raise AssertionError("no beat within 10 s")

    with beating:
        burn(cpu, 0.3)
        time.sleep(3.0)  # the beats after the burn
        burnt = busy(time.time())
        time.sleep(4 * sw.PULSE_S)  # waiting: no CPU
        assert busy(time.time()) == burnt
        began = time.time()
        burn(cpu, 0.3)
        assert busy(time.time()) >= began


def test_a_clamp_case_with_an_open_bound_runs_the_op():
    """clamp's `none` bound reaches the call as None from a parsed case id (the sweeps' cases
    are parsed): float(None) made 3 of clamp's 4 parameter draws an invalid draw that tested nothing."""
    torch = pytest.importorskip("torch")
    from suites.generators.op_calls import CALLS

    case = parse_case("clamp~2~f32~7x4~R~lo=none,hi=0.5~933")
    x = torch.tensor([[-2.0, 0.25, 3.0]])
    [out] = CALLS["clamp"]([x], case.param, None)
    assert out.tolist() == [[-2.0, 0.25, 0.5]]


def test_a_lost_row_of_a_resumed_sweep_is_counted_and_filed_once(tmp_path):
    def run(folder: Path, cases: list) -> list[dict]:
        return [{"id": c.id, "status": "lost" if c.op == "sdpa" else "pass",
                 "signature": "sdpa: the sweep died on this case" if c.op == "sdpa" else None,
                 "message": "", "seconds": 0.01} for c in cases]

    ticks = iter(range(0, 10_000, 5))
    report = Sweeps("s", run, tmp_path, clock=lambda: next(ticks), log=lambda m: None).run(1e9, max_cases=300)
    assert report.counts["lost"] >= 2 and report.cases == 300  # every case answered: none queued again
    assert [f.signature for f in report.finds if "died" in f.signature] == ["sdpa: the sweep died on this case"]


SURVIVORS = [
    # (case, what its row must say): run in this order on one sweep of each world size
    ("argmax~2~f32~1x2~S-1~dim=-1~671", "fail|pass"),  # 2.13 raises alike; shrinking reaches an empty shard
    ("cat~2~f32~3x7,3x7~S0,R~dim=0~3", "pass"),  # after it: answered, not lost
    ("permute~2x2~bf16~7x3x5x12~SS0.S0~perm=3:2:1:0~499", "pass"),  # c2: FSDP2-over-TP's layout, uneven
    ("nll_log_softmax~2x2~f32~1x1,1~R.R,SS0.S0~-~0", "pass"),  # c2: the night's o2, 26 + 24 cases
    ("foreach_norm~4~bf16~8x2,16~S-1,S-1~ord=inf~820", "fail"),  # raises on ranks 2-3 only: a hang
    ("silu~4~f32~5x3~S0~-~1", "pass"),  # after it: answered, not lost
]


@pytest.mark.slow
def test_a_sweep_goes_on_after_cases_that_hang_or_desync_its_ranks(ops_session, tmp_path):
    """A sweep as the ops generator runs one: every case answered, in order, the hang a find
    with its error, the _StridedShard inputs built (no AssertionError)."""
    cases = [c for c, _ in SURVIVORS]
    rows = _sweep(ops_session, tmp_path, cases, shrink={"max_checks": 30, "max_s": 60}, hang_s=10)
    statuses = {c: rows.get(c, {}).get("status") for c in cases}
    assert all(statuses[c] in want.split("|") for c, want in SURVIVORS), (statuses, _log_tail(ops_session))
    hang = rows["foreach_norm~4~bf16~8x2,16~S-1,S-1~ord=inf~820"]
    assert "with empty shards raised on ranks holding them only, the others hang" in hang["signature"]
    assert "argmax" not in " ".join(r["signature"] or "" for r in rows.values() if "died" in (r["signature"] or ""))
    assert (tmp_path / "ws2.done").exists() and (tmp_path / "ws4.done").exists()


@pytest.mark.slow
def test_a_case_raised_on_some_ranks_only_is_agreed_in_seconds_not_waited_out(ops_session, tmp_path):
    """vector_norm(inf) of a (1, 1) tensor sharded on dim 1: rank 1 holds an empty shard and
    raises, rank 0 goes on. The ranks agree right after the op that one raised, so the case is
    the same hang find within its own slot in seconds; before, rank 0 waited in the judge's next
    collective, rank 1 out the side group's timeout (60 s here) and a resume slot recorded it
    ("died")."""
    hang, after = "vector_norm~2~f32~1x1~S1~ord=inf,dim=none,keepdim=0~0", "sum~2~f32~4x4~S0~dim=none,keepdim=0~0"
    rows = _sweep(ops_session, tmp_path, [hang, after], shrink={"max_checks": 0}, hang_s=60)
    assert rows[after]["status"] == "pass", (rows, _log_tail(ops_session))
    row = rows[hang]
    assert not row.get("died") and row["seconds"] < 20, row  # its own slot, in seconds
    assert row["signature"] == ("the op with empty shards raised on ranks holding them only, the others hang: "
                                "RuntimeError: linalg.vector_norm cannot compute the inf norm on an empty tensor "
                                "because the operation does not have an identity"), row
    assert "ranks [1] raised, ranks [0] went on" in row["message"], row["message"]


BLOCKS_A_PEER = "clip_grad_norm~2~f32~1x3,4~S0,S0~max_norm=1.0,ord=inf~0"
"""The bench's lost ws4 slots, on 2 ranks: rank 1's shard of the 1x3 gradient is empty, its
_foreach_norm(inf) raises; rank 0 goes on into clip_grad_norm_'s own all-reduce and waits there,
never reaching the raised-anywhere agreement (a near miss of dtensor-max-empty-shard)."""


@pytest.mark.slow
def test_a_peer_blocked_in_the_ops_own_collective_ends_the_slot_in_seconds(ops_session, tmp_path):
    """Rank 1 (raised) sees through rank 0's pulse that rank 0 issued a collective it never will
    and stopped: it gives up at once instead of waiting the largest bound any rank can hold
    (45 s here), and the next slot records the hang find and goes on."""
    import time

    from suites.generators.case_bound import LOAD_CAP, bound_s
    from suites.generators.ops_outcome import ASK_MARGIN_S
    from suites.generators.ops_sweep import HANG_S

    after = "silu~2~f32~5x3~S0~-~1"
    assert _sweep(ops_session, tmp_path / "warm", [after])[after]["status"] == "pass"  # the session is up
    began = time.monotonic()
    rows = _sweep(ops_session, tmp_path / "blocked", [BLOCKS_A_PEER, after], shrink={"max_checks": 0})
    took = time.monotonic() - began
    row = rows.get(BLOCKS_A_PEER, {})
    assert row.get("status") == "fail" and rows.get(after, {}).get("status") == "pass", (rows, _log_tail(ops_session))
    assert "with empty shards raised on ranks holding them only, the others hang" in row["signature"], row
    assert "_foreach_norm cannot compute the infinity norm" in row["signature"], row
    assert "ranks [1] finished the case, ranks [0] never did" in row["message"], row["message"]
    waited_s = max(bound_s([(1, 3), (4,)], load=LOAD_CAP), HANG_S) + ASK_MARGIN_S  # what it waited before
    assert took < waited_s, (took, waited_s)
    print(f"the blocked case's sweep: {took:.1f} s (it waited {waited_s:.0f} s before)")


# ---------------------------------------------------------------- a case that spins fails in seconds

def _loop_with_a_helper() -> None:
    n = 0
    while n >= 0:
        n = _helper(n)


def _helper(n: int) -> int:
    return (n * 7 + 1) % 1_000_003


def test_the_case_bound_ends_a_python_loop_naming_the_loop_and_leaves_no_timer():
    """The bound raises in this thread once its time passed, names the function every stack
    sample shares (the loop, not the helper it happens to be in), and restores SIGALRM and the
    timer; a call that returns in time is untouched."""
    from suites.generators.case_bound import Bound, CaseTimeout

    before = signal.getsignal(signal.SIGALRM)
    bound = Bound(0.3)
    with pytest.raises(CaseTimeout):
        with bound:
            _loop_with_a_helper()
    assert bound.armed and 0.3 <= bound.elapsed < 5
    assert bound.hit.where == "_loop_with_a_helper", bound.hit
    assert bound.hit.signature == "the case did not return within its time bound (looping in _loop_with_a_helper)"
    assert not bound.hit.propagation and bound.hit.frames[0].startswith("test_fuzz_ops.py:")  # no machine path
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is before
    with Bound(5.0) as quick:
        assert sum(range(1000)) == 499500
    assert quick.hit is None and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_case_bound_grows_with_the_load_and_the_sizes_and_sits_well_above_measured_cases():
    """10 s on idle cores (the slowest case measured there: 1.2 s), 40 s at most for load (the
    slowest at load 10-15 on 2 cores: 10.5 s), plus the work of sizes no draw reaches."""
    from suites.generators import case_bound as cb

    drawn = draw_cases("bound", 0, 400)
    idle = max(cb.bound_s(c.shapes, load=1.0) for c in drawn)
    assert cb.BASE_S <= idle < cb.BASE_S + 0.2  # a drawn case's sizes add milliseconds
    assert max(cb.bound_s(c.shapes, load=cb.LOAD_CAP) for c in drawn) < 4 * cb.BASE_S + 0.2
    assert cb.bound_s([(4096, 4096), (4096, 4096)], load=1.0) > 3 * cb.BASE_S  # a big case written by hand
    assert 1.0 <= cb.contention() <= cb.LOAD_CAP


def test_a_spin_in_view_groups_is_a_near_miss_of_the_registered_loop_never_new():
    """What the bound makes of the zero-dim reshape, on every rank or on some ranks only (the
    others then hang in a collective), names dtensor-view-zero-dim-loops for any op's case, read
    as a find's replay is judged (distci/fuzz/ops_command.py's judge_find: the stored error
    signature, numbers turned into N); sdpa's decomposition, cut fixes off, names its own entry."""
    from distci.known_issues import load_registry
    from distci.results import error_signature
    from suites.generators.case_bound import BoundHit
    from suites.generators.ops_sweep import hang_row

    registry = load_registry(REPO / "suites" / "known_issues.toml")

    def near(case: str, headline: str, torch: str = "2.13.0") -> list[str]:
        return registry.near_misses(f"suites/generators/ops_entry.py::test_op_case[{case}]",
                                    error_signature("AssertionError", headline), headline, Stack(torch=torch))

    def known(case: str, headline: str, torch: str = "2.13.0") -> str | None:
        return registry.match(f"suites/generators/ops_entry.py::test_op_case[{case}]",
                              error_signature("AssertionError", headline), headline, Stack(torch=torch))

    hit = BoundHit(12.5, "view_groups", True, ("torch/distributed/tensor/_ops/_view_ops.py:487 view_groups",))
    for case in ("reshape_merge~4~f32~16x12x0x12~Pavg~-~962", "flatten01~2~f32~0x3~R~-~0"):
        row = hang_row(case, {"status": "fail", "signature": hit.signature, "message": hit.signature})
        if case.startswith("reshape_merge"):  # an op the entry's tests name: known, not a near miss
            assert known(case, hit.signature) == known(case, row["signature"], "2.15.0") == \
                "dtensor-view-zero-dim-loops"
            assert near(case, hit.signature) == []
            continue
        assert near(case, hit.signature) == ["dtensor-view-zero-dim-loops"]
        assert near(case, row["signature"], "2.15.0") == ["dtensor-view-zero-dim-loops"]
    for where in ("_propagate_through_decomp", "propagate_strategy"):  # the bench's sdpa cases, fixes off
        sdpa = BoundHit(40.0, where, True, ()).signature
        case = "sdpa~2~bf16~7x5x9x7,7x5x11x7,7x5x11x7~R,S1,Psum~is_causal=0~801"
        assert near(case, sdpa) == near(case, hang_row(case, {"status": "fail", "signature": sdpa})["signature"]) \
            == ["dtensor-sdpa-cpu-sharding-propagation-time"]
    assert near("sigmoid~2~f32~3x4~S0~-~0", BoundHit(12.5, "_spin_forever", False, ()).signature) == []


SPIN_BASE_S = 3.0
"""The spinning cases' bound on idle cores in the sweep below (case_bound.BASE_S is 10 s)."""
SPINNERS = [
    # (case, what its row must say), one sweep of 2 ranks, in this order; DISTCI_OPS_PLANT=spin
    ("reshape_merge~2~f32~2x3x0x4~R~-~0", "the case did not return within its time bound (sharding propagation looping in view_groups)"),
    ("silu~2~f32~5x3~S0~-~1", "pass"),
    ("sigmoid~2~f32~3x4~S0~-~0", "the case did not return within its time bound (looping in _spin_forever)"),  # every rank
    ("cat~2~f32~3x7,3x7~S0,R~dim=0~3", "pass"),
    ("gelu~2~f32~3x11x11~R~approximate=tanh~319", "(looping in _spin_forever) (some ranks only, the others hang)"),
    ("silu~2~f32~4x3~S1~-~2", "pass"),  # after the slot the rank-0 spin ended: resumed
    ("softmax~2~f32~3x11x11~R~dim=2~816", "the case did not return within its time bound (looping in _spin_forever)"),
    ("silu~2~f32~5x3~S0~-~7", "pass"),  # not under the mode the cut case left pushed: a fresh slot
    ("clamp~2~f32~7x4~R~lo=-0.5,hi=0.5~933", "clamp: every rank waits in a collective its peers never issue (a deadlock)"),
    ("silu~2~f32~5x3~S1~-~8", "pass"),  # after the slot the ranks' pulses ended
]


@pytest.mark.slow
def test_a_case_that_spins_fails_within_its_bound_and_the_sweep_goes_on(ops_session, tmp_path):
    """The ops bench (fixes off) hung 300 s on the zero-dim reshape (view_groups loops before any
    collective) and lost its slot. Under the case bound each spinning case (the real one, a
    planted loop on every rank, one on rank 0 alone while rank 1 waits in the judge's
    collective, one that leaves a dispatch mode pushed) is a failure naming where it spun, within
    its bound, and the next case runs (on fresh ranks after the last two). A case that deadlocks
    every rank in C (no bound can cut it) is ended by the ranks' pulses once every rank stood
    still QUIET_S, not by the 240 s watchdog, and filed as a deadlock.
    The batch's watchdog is 240 s, so without the bound the spins are lost rows, not a hung test.
    The batch lowers the bound's idle base to SPIN_BASE_S (each spin costs it times the load:
    4 x 34 s of the test's 146 s at load 6.8 with the default 10 s); the passing cases take
    milliseconds, the first of a fresh slot ~1 s idle, so they stay far inside it."""
    from suites.generators.case_bound import LOAD_CAP

    import time

    cases = [c for c, _ in SPINNERS]
    began = time.monotonic()
    rows = _sweep(ops_session, tmp_path, cases, shrink={"max_checks": 0}, hang_s=10, case_limit_s=240,
                  bound_base_s=SPIN_BASE_S)
    took = time.monotonic() - began
    got = {c: (rows.get(c, {}).get("status"), rows.get(c, {}).get("signature")) for c in cases}
    for case, want in SPINNERS:
        status, signature = got[case]
        assert (status == "pass") if want == "pass" else (status == "fail" and want in (signature or "")), \
            (case, got, _log_tail(ops_session))
    for case, frame in [(cases[0], "torch/distributed/tensor/_ops/_view_ops.py:"),
                        (cases[2], "suites/generators/ops_plants.py:")]:  # agreed on every rank, in its bound
        assert rows[case]["seconds"] < SPIN_BASE_S * LOAD_CAP + 5, rows[case]
        assert f"\n    {frame}" in rows[case]["message"], rows[case]["message"]
    assert "no rank issued a collective or used CPU for" in rows[cases[-2]]["message"], rows[cases[-2]]
    assert took < 240, took  # the deadlock never waited for the watchdog (68-100 s at load 14-17; 247 s
    # with the pulse's exit taken away and the watchdog at 150 s)
    assert (tmp_path / "ws2.done").exists()


@pytest.mark.slow
def test_a_replayed_case_every_rank_deadlocks_in_fails_in_seconds_with_the_deadlock_as_its_message(ops_session, tmp_path):
    """A fuzz run replays each find as `test_op_case[<id>]`, an ordinary Result the registry
    matches. A deadlock find (the idle bench's index_add~2x2) had no pulse there: its replay
    waited 1,396 s for the harness's timeout and was recorded as a bare hang, so the nightly would
    have filed a registered bug as new. The replay runs under the ranks' pulses too: the planted
    deadlock (clamp, DISTCI_OPS_PLANT=spin) ends in seconds and its Result's message is the
    deadlock's diagnosis, the rank's last words (distci/harness/outcome.py LAST_WORDS)."""
    import time

    case = "clamp~2~f32~7x4~R~lo=-0.5,hi=0.5~933"
    began = time.monotonic()
    [result] = _one_case(ops_session, tmp_path / "replay", case)
    took = time.monotonic() - began
    assert result["outcome"] == "failed", result
    assert "ended itself" in result["message"], result["message"][:600]
    assert "clamp: every rank waits in a collective its peers never issue (a deadlock)" in result["error_signature"], \
        result["error_signature"]
    assert took < 200, took  # the harness's own timeout for the test is far longer


@pytest.mark.slow
def test_the_in_step_check_sees_a_collective_one_rank_left_issued_at_once():
    """The sweep's clock reads rank 0's time on every rank (its slot and shrink budgets decide
    the same everywhere). After a case that raised, a rank may have left a collective issued that its peer never
    issued; the sweep's in-step check must say so on both ranks (the slot ends, the next runs
    on fresh ranks) and at once, by the collectives each rank issued: a barrier alone pairs with
    the stray collective on one rank and waits out `hang_s` on the other (tests/instep_ranks.py)."""
    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, str(REPO / "tests" / "instep_ranks.py")], capture_output=True, text=True,
                          timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("in step: True, then False") == 2, done.stdout


def test_a_slot_whose_finished_ranks_only_went_on_files_the_missed_agreement_not_their_status():
    """The 2026-12-07 night runs filed three finds as `<op>: went_on (some ranks only, the others
    hang)`: the ranks that finished had left a phase whose raised-anywhere agreement a peer never
    reached (PeersGone, status WENT_ON), and the dead slot took that internal status for the
    error. The row says what happened instead, and still as the hang it is."""
    from suites.generators.ops_outcome import WENT_ON
    from suites.generators.ops_sweep import dead_rows

    case = "reshape_merge~2~f32~11x1x9x3~R~-~60"
    stuck = [{"rank": 0, "id": case, "status": WENT_ON, "signature": None, "message": "", "seconds": 0.0,
              "empty": False, "raised": False}]
    [row] = dead_rows({"id": case, "candidate": None}, stuck, 2)
    assert row["status"] == "fail" and WENT_ON not in row["signature"]
    assert row["signature"].startswith("reshape_merge: a peer never reached the agreement after a phase")
    assert row["signature"].endswith("(some ranks only, the others hang)")
    assert "ranks [0] finished the case, ranks [1] never did" in row["message"]
