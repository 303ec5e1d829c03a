"""The fuzzer finds planted bugs and shrinks each to the axes the bug needs, end to end.

Each plant is one `python -m distci fuzz` run for real (this interpreter's stack, 2 gloo
ranks) with one bug of suites/generators/config_plants.py planted, in a space restricted to a
few axes and a budget of a few draws and no reruns (the plants are deterministic) so it fits
CI; a module fixture makes each run once for every test that reads it. The
bug is only visible in a combination (accumulation; a Float8 recipe; FSDP x full AC),
the draws carry distractor axes, and the shrunk configuration must keep exactly the
axes the bug needs, no more. A seed replays: a run runs the configurations `--list` prints
beforehand, whatever the process's hash seed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from distci.harness import procs  # noqa: E402 - after the torch check, as the harness needs it

REPO = Path(__file__).resolve().parents[1]
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_off"
"""Only its id and fixes mode are read: the configurations run on this interpreter's stack."""

CASES = {
    # plant: (the axes drawn, with their values; the axes the shrunk configuration must have; the seed;
    #         configurations drawn)
    "accum_drop": ({"parallel": "tp,fsdp", "ac": "none,full", "accum": "1,2,4", "optim": "sgd,adamw"},
                   {"accum": 2}, "accum201", 1),
    "float8_scale": ({"float8": "none,rowwise", "ac": "none,full", "optim": "sgd,adamw"}, {"float8": "rowwise"},
                     "float8154", 3),  # no accumulation: a Float8 run of two microbatches is the costliest on CPU
    "ac_all_gather": ({"parallel": "tp,fsdp", "ac": "none,full", "accum": "1,2", "mp": "none,bf16",
                       "optim": "sgd,adamw"}, {"parallel": "fsdp", "ac": "full"}, "ac104", 1),
    # a size: drawn at 4 steps, the shrinker tries 1 (passes: the bug needs a second step), then 2
    "late_step_drop": ({"parallel": "tp,fsdp", "ac": "none,full", "steps": "1,2,3,4", "optim": "sgd,adamw"},
                       {"steps": 2}, "late1005", 1),
}
"""Every other axis is held at its default: eager, 2 ranks, and none of the costlier columns.
Each seed's first draw fails with exactly two distractor axes on, so the shrinker has work to
do and no configuration runs that the test does not read (`--list` with the same arguments
shows the draws). float8_scale draws three, each of which its shrink needs (the passing
`tp-eager` and `tp-eager-ac_full-adamw` are one-step simplifications on its way): the
same-seed test reads that run's draws."""

def fuzz(tmp: Path, *args: str, plant: str = "", timeout: int = 1500) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    env.pop("DISTCI_FUZZ_PLANT", None)
    if plant:
        env["DISTCI_FUZZ_PLANT"] = plant
    runs = tmp / "runs"
    cmd = [sys.executable, "-m", "distci", "fuzz", "--cell", CELL, "--python", sys.executable,
           "--runs-root", str(runs), *args]
    # owned: the command and its ranks die with this test, however it ends
    child = procs.start_owned(cmd, env=env, token=procs.run_token(), death_signal=signal.SIGTERM, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=timeout)
    finally:
        if child.poll() is None:
            procs.stop(child)
    proc = subprocess.CompletedProcess(cmd, child.returncode, out, err)
    reports = sorted(runs.glob("*/fuzz/report.json"))
    assert reports, f"no report.json:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc, json.loads(reports[-1].read_text())


def _space_args(drawn: dict[str, str]) -> list[str]:
    from suites.generators.space import AXES

    return [arg for a in AXES for arg in ("--space", f"{a.name}={drawn.get(a.name, a.default)}")]


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """`planted_run(plant) -> (run's directory, the finished command, report.json)`: each plant's
    fuzz run made once per module, whichever tests read it (a fuzz run is a controller, a
    pytest session and a rank pool: the cost of a test here)."""
    runs: dict[str, tuple[Path, subprocess.CompletedProcess, dict]] = {}

    def run(plant: str):
        if plant not in runs:
            tmp = tmp_path_factory.mktemp(plant)
            space, _, seed, draws = CASES[plant]
            # the 20-minute budget; a find may use all of its half for shrinking (the default
            # quarter is for nights with many finds; on a loaded 2-core runner one round can take minutes)
            # judged against the real registry: a plant is a new bug by construction, and no entry's
            # generic numeric alternative ("gradient SQNR") may name it a near miss (Registry.near_misses)
            runs[plant] = (tmp, *fuzz(tmp, "--seed", seed, "--max-configs", str(draws), "--budget", "20m",
                                      "--shrink-limit", "10m", "--reruns", "0", "--report", str(tmp / "report.md"),
                                      *_space_args(space), plant=plant))
        return runs[plant]
    return run


@pytest.mark.slow
@pytest.mark.parametrize("plant", list(CASES))
def test_a_planted_bug_is_found_and_shrunk_to_what_it_needs(planted_run, plant):
    from distci.fuzz import space as fuzz_space
    from suites.generators import space as cell

    def Space():
        return fuzz_space.Space(cell)

    _, needs, _, _ = CASES[plant]
    tmp_path, proc, report = planted_run(plant)
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert len(report["finds"]) >= 1, out[-3000:]
    assert report["finds"][0]["near_miss"] is None, report["finds"][0]
    shrunk = report["finds"][0]["shrunk"]
    assert Space().non_default(shrunk["point"]) == needs, out[-3000:]
    assert report["finds"][0]["complete"]
    assert len(Space().non_default(next(o for o in report["tried"] if o["id"] == report["finds"][0]["found"])["point"])) \
        >= len(needs) + 2, "the find came with distractor axes to shrink away"
    # printed as a row ready to paste, its id and a repro that names the configuration
    assert f"  id:     {shrunk['id']}" in out
    assert "  row:    row(" in out
    assert f"--cell {CELL} --test 'suites/fuzz_entry.py::test_fuzz_config[{shrunk['id']}]'" in out
    # one line per configuration, and every configuration an ordinary Result of the run
    for o in report["tried"]:
        assert o["id"] in out
    results = [json.loads(line) for line in next((tmp_path / "runs").glob("*/results.jsonl")).read_text().splitlines()]
    ids = {r["test_id"] for r in results}
    assert {o["test_id"] for o in report["tried"]} <= ids
    failed = next(r for r in results if r["test_id"] == shrunk["test_id"])
    assert failed["outcome"] == "failed" and failed["cell_id"] == CELL and failed["stack"].get("torch")
    assert (tmp_path / "report.md").read_text().count("| shrink |") + (tmp_path / "report.md").read_text().count(
        "| drawn |") == len(report["tried"])


@pytest.mark.slow
def test_the_same_seed_runs_the_same_configurations(planted_run):
    """A seed replays: `--list` draws the same configurations in two processes (their hash
    seeds differ on purpose: nothing may depend on PYTHONHASHSEED or the clock), and a run draws
    and runs exactly what `--list` printed, in order, before it shrinks anything. The run is
    float8_scale's planted one (a plant changes what fails, never what is drawn): a run draws
    through the same Drawer as `--list`, so two runs agree exactly when both agree with the
    listing."""
    space, _, seed, draws = CASES["float8_scale"]
    args = ["--seed", seed, "--max-configs", str(draws), *_space_args(space)]

    def listed(hash_seed: str) -> list[str]:
        return subprocess.run([sys.executable, "-m", "distci", "fuzz", "--cell", CELL, "--list", *args], cwd=REPO,
                              env={**os.environ, "PYTHONHASHSEED": hash_seed}, capture_output=True, text=True,
                              timeout=120, check=True).stdout.split()

    first, second = listed("1"), listed("2")
    assert len(first) == 3 and first == second
    _, _, run = planted_run("float8_scale")
    assert run["drawn"] == first
    # the first batch is the draws, in order; the shrink's candidates come after them
    assert [o["id"] for o in run["tried"]][:len(first)] == first
