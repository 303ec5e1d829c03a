"""The 2-node CPU cell through a real Slurm: slurmctld and two slurmds started by the test
(each slurmd on a simulated host, tests/slurmcluster.py), the cell's run submitted with
`sbatch` (distci.launch.slurm.batch_script), every test's agents started with `srun`, one
task per node. Skips with the reason where Slurm cannot be installed or namespaces made."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from distci.launch import netns
from distci.launch.netns import SimulatedHosts
from distci.launch.slurm import batch_script, submit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from slurmcluster import LocalSlurm, install_problem  # noqa: E402

CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-n2-fix_on"
ROWS = ["suites/test_nodes.py", "suites/test_scenarios.py::test_scenario[ddp-eager]"]


@pytest.fixture
def slurm(tmp_path: Path):
    reason = netns.unavailable() or install_problem()
    if reason:
        pytest.skip(reason)
    hosts = SimulatedHosts(2)
    cluster = LocalSlurm(hosts, tmp_path / "slurm")
    try:
        hosts.create()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        hosts.destroy()
        assert netns.namespaces(hosts.prefix) == []


@pytest.mark.slow
def test_the_two_node_cell_passes_through_slurm(slurm: LocalSlurm, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", "-p", "distci.launch.plugin",
               "-p", "no:cacheprovider", f"--rootdir={REPO}", "--distci-nodes=2", "--distci-hosts=slurm",
               "--distci-world-size=2", f"--distci-run-dir={run_dir}", f"--distci-cell={CELL}",
               *[str(REPO / r) for r in ROWS]]
    script = tmp_path / "cell.sbatch"
    script.write_text(batch_script(CELL, 2, command=command, workdir=tmp_path, time_limit_min=20))
    import os

    os.environ["SLURM_CONF"] = str(slurm.conf)  # sbatch --export=ALL hands it to the job
    try:
        job, code = submit(script, timeout_s=900, prefix=slurm.prefix)
    finally:
        os.environ.pop("SLURM_CONF", None)
    out = (tmp_path / f"slurm-{job}.out").read_text() if (tmp_path / f"slurm-{job}.out").exists() else ""
    assert code == 0, out[-6000:]
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert {r["test_id"].split("::")[0] for r in results} == {"suites/test_nodes.py", "suites/test_scenarios.py"}
    assert [r["outcome"] for r in results] == ["passed"] * 3, [(r["test_id"], r["outcome"], r["message"][:500])
                                                               for r in results]
    stack = json.loads((run_dir / "stack.json").read_text())
    assert [n["host"] for n in stack["nodes"]] == ["node0", "node1"]
