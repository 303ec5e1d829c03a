"""nightly.yml, run here as a runner would run it: every job's steps, in order, as a non-root user.

A `workflow_dispatch` of the release tier with `select` narrowing each cell to one small
test: the matrix job lists the tier's cells; the CPU cell's leg builds its image FROM the
debootstrap base (DISTCI_BASE_IMAGE=local, under its own distci/base tag, since nothing can
be pulled here) and runs in a container; its container is torn down; the
aggregate job records the run in a history branch (a bare repository standing in for the
GitHub remote), renders the dashboard and writes the HUD rows; the gate job judges the
tier, and fails because the GPU cells had no runner (their infra runs make it
INCOMPLETE); the hud job produces the relay callback's inputs for each cell.

The steps run as DISTCI_CI_USER (made by .ci/run: a user in the docker group, not root),
with GitHub's environment variables. The user builds and runs images through the docker
group alone; the debootstrap base is made once per machine, as root, before (the admin
step docs/runners.md describes). Needs a Docker daemon and that user; skipped otherwise.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO
from dockerd import docker_client  # noqa: F401 - the session fixture
from jobsteps import PASS_THROUGH, SYSTEM_PATH, Runner

CPU_CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
SELECT = "test_tp_mlp[eager-sgd]"
USER_VAR = "DISTCI_CI_USER"

pytestmark = pytest.mark.docker


def _ci_user() -> str:
    """The non-root user the steps run as: DISTCI_CI_USER when root, else this user; must be in `docker`."""
    if os.geteuid() == 0:
        name = os.environ.get(USER_VAR, "")
        if not name:
            pytest.skip(f"{USER_VAR} is not set (.ci/run makes that user: non-root, in the docker group)")
        try:
            pwd.getpwnam(name)
        except KeyError:
            pytest.skip(f"{USER_VAR}={name} does not exist")
    else:
        name = pwd.getpwuid(os.getuid()).pw_name
    try:
        members = grp.getgrnam("docker").gr_mem
    except KeyError:
        pytest.skip("no docker group on this machine")
    if name not in members and pwd.getpwnam(name).pw_gid != grp.getgrnam("docker").gr_gid:
        pytest.skip(f"user {name} is not in the docker group")
    return name


def _copy_tree(dest: Path) -> None:
    """The working tree as a checkout has it: tracked and untracked-but-not-ignored files."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.fixture
def actions_root():
    """A directory the CI user can reach (pytest's tmp_path is private to root)."""
    root = Path(tempfile.mkdtemp(prefix="distci-jobsteps-"))
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_the_nightly_jobs_steps_in_order(docker_client, actions_root):
    from distci.images import ensure_local_base

    user = _ci_user()
    ensure_local_base(docker_client, log=print)  # once per machine, as root (docs/runners.md)
    root = actions_root
    workspace = root / "workspace"
    workspace.mkdir()
    _copy_tree(workspace)
    remote_root = root / "github"
    (remote_root / "distci").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "--bare", str(remote_root / "distci" / "distci.git")], check=True)
    home = root / "home"
    home.mkdir()
    (root / "toolcache").mkdir()
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", f"{user}:{user}", str(root)], check=True)

    env = {k: v for k, v in os.environ.items() if PASS_THROUGH.match(k)}
    env.update({
        "PATH": SYSTEM_PATH, "HOME": str(home), "USER": user, "LANG": "C.UTF-8", "CI": "true",
        "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(workspace), "GITHUB_REPOSITORY": "distci/distci",
        "GITHUB_SERVER_URL": f"file://{remote_root}", "GITHUB_API_URL": "http://127.0.0.1:9",
        "GITHUB_EVENT_NAME": "workflow_dispatch", "GITHUB_REF": "refs/heads/distci-test",
        "GITHUB_REF_NAME": "distci-test", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_WORKFLOW": "nightly",
        "RUNNER_OS": "Linux", "RUNNER_ARCH": "X64", "RUNNER_NAME": "distci-test-runner",
        "RUNNER_TOOL_CACHE": str(root / "toolcache"),
    })
    runner = Runner(workspace / ".github" / "workflows" / "nightly.yml", workspace, root, user=user,
                    labels={"ubuntu-latest"}, inputs={"tier": "release", "issues": False, "select": SELECT, "fuzz": False},
                    variables={"DISTCI_BASE_IMAGE": "local"}, env=env)
    started = time.monotonic()
    jobs = runner.run_all()
    print(f"job steps: {time.monotonic() - started:.0f}s")
    for name, legs in jobs.items():
        for leg in legs:
            print(f"  {name} {leg.leg.get('cell', '')} {leg.result}: "
                  + ", ".join(f"{s.name} {s.seconds:.0f}s" for s in leg.steps if s.seconds >= 1))

    def show(job) -> str:
        return "\n".join(f"--- {s.name} (rc {s.rc}, {s.seconds:.0f}s)\n{s.output[-2500:]}" for s in job.steps)

    # matrix: the release tier's cells, with the runner labels matrix.toml declares.
    (matrix,) = jobs["matrix"]
    assert matrix.result == "success", show(matrix)
    cells = json.loads(matrix.outputs["matrix"])["include"]
    assert matrix.outputs["tier"] == "release" and int(matrix.outputs["cells"]) == len(cells) > 1
    by_cell = {leg.leg["cell"]: leg for leg in jobs["cells"]}
    assert set(by_cell) == {c["cell"] for c in cells}

    # cells: the CPU leg ran on this machine, in its image, as the non-root user; nothing is left running.
    cpu = by_cell[CPU_CELL]
    assert cpu.result == "success", show(cpu)
    assert [s.kind for s in cpu.steps][-1] == "run" and cpu.steps[-1].name == "Remove this job's containers"
    assert "0 container(s)" in cpu.steps[-1].output or "removed" in cpu.steps[-1].output, show(cpu)
    (run_dir,) = (runner.artifacts / f"run-{CPU_CELL}").iterdir()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["backend"] == "docker" and info["image"].startswith(f"distci/cpu:{CPU_CELL}-")
    container = json.loads((run_dir / "container.json").read_text())
    assert container["labels"]["distci.cell"] == CPU_CELL
    assert container["labels"]["distci.job"] == f"gh{runner.run_id}-1"
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert results and all(r["outcome"] == "passed" for r in results), results
    assert [r["test_id"] for r in results] == ["suites/test_tp_mlp.py::test_tp_mlp[eager-sgd]"]
    written = next((cpu.temp / "runs").glob("*/results.jsonl"))
    assert os.stat(written).st_uid == pwd.getpwnam(user).pw_uid  # by the non-root user, through the mount
    assert docker_client.containers.list(all=True, filters={"label": f"distci.job=gh{runner.run_id}-1"}) == []
    gpu = [leg for cell, leg in by_cell.items() if cell != CPU_CELL]
    assert gpu and all(leg.result == "no-runner" for leg in gpu)

    # aggregate: history pushed to the data branch, dashboard rendered, HUD rows written.
    (agg,) = jobs["aggregate"]
    assert agg.result == "success", show(agg)
    branch = subprocess.run(["git", "--git-dir", str(remote_root / "distci" / "distci.git"), "ls-tree", "-r",
                             "--name-only", "distci-data"], capture_output=True, text=True, check=True).stdout
    assert f"runs/{info['run_id']}/results.jsonl" in branch
    assert sum(line.endswith("results.jsonl") for line in branch.splitlines()) == len(cells)  # + infra runs
    assert (runner.artifacts / "github-pages" / "index.html").is_file()
    rows = [json.loads(line) for line in (runner.artifacts / "store" / "hud.jsonl").read_text().splitlines()]
    assert [r["job_name"] for r in rows] == [CPU_CELL]

    # gate: the release tier cannot pass while cells never ran.
    (gate,) = jobs["gate"]
    step = gate.step("nox -s gate -- --tier TIER")
    missing = [c["cell"] for c in cells if c["cell"] != CPU_CELL]
    assert all(cell in step.output for cell in missing), step.output[-4000:]
    assert step.rc != 0 or "INCOMPLETE" not in step.output, step.output[-4000:]

    # hud: the CPU cell's relay inputs (a release row is a `nightly` event); the others have no torch SHA.
    hud = {leg.leg["cell"]: leg for leg in jobs["hud"]}
    relay = hud[CPU_CELL].step("Post it to the cross-repo CI relay")
    assert relay.kind == "uses", show(hud[CPU_CELL])
    # the walk's cells run narrowed by `select`: such a run is evidence, not a complete cell, so HUD
    # hears `neutral`, never `success` (distci.publish.export, the gate's coverage judgement)
    assert relay.inputs["event-type"] == "nightly" and relay.inputs["conclusion"] == "neutral"
    assert relay.inputs["job-name"] == CPU_CELL and len(relay.inputs["delivery-id"]) == 40
    assert relay.inputs["artifact-url"].endswith(f"/distci/distci/actions/runs/{runner.run_id}")
    assert json.loads(relay.inputs["test-results"])["passed"] == len(results)
    for cell in missing:
        assert hud[cell].step("Post it to the cross-repo CI relay").kind == "skipped"
    assert jobs["deploy"][0].result == "skipped"  # Pages deploys from the default branch only
    assert jobs["fuzz"][0].result == "skipped"  # dispatched with fuzz: false (its own tests cover the command)
