"""The GitHub Actions workflows: matrix from matrix.toml, runners, pins and permissions.

These are the properties a reviewer cannot see in a diff of one workflow: that the GPU
and NPU jobs get their runner labels from matrix.toml and nowhere else, that no pull
request can reach a self-hosted runner, and that every action is pinned and every job
is bounded in time and privilege. actionlint and zizmor (`nox -s lint`) check syntax
and the generic security rules; this file checks distci's own rules.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any, Iterator

import pytest
import yaml

from conftest import REPO
from distci.ci.actions import cell_outputs
from distci.ci.regressions import BISECT_AXES, BisectPlan
from distci.matrix import load_matrix

WORKFLOWS = REPO / ".github" / "workflows"
MATRIX = load_matrix(REPO / "matrix.toml")
HOSTED = re.compile(r"^(ubuntu|windows|macos)-[\w.-]+$")
SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")
# Events a fork's pull request (or a stranger's comment) can trigger.
UNTRUSTED_EVENTS = {"pull_request", "pull_request_target", "pull_request_review", "pull_request_review_comment",
                    "issue_comment", "workflow_run", "discussion", "discussion_comment", "fork", "watch"}


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def workflows() -> dict[str, dict[str, Any]]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(WORKFLOWS.glob("*.y*ml"))}


def triggers(wf: dict[str, Any]) -> dict[str, Any]:
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` as True
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return dict(on)


def steps(job: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from job.get("steps", [])


def is_self_hosted_capable(runs_on: Any) -> bool:
    """Whether a runs-on may name a self-hosted runner: anything but literal hosted labels."""
    labels = runs_on if isinstance(runs_on, list) else [runs_on]
    return not all(isinstance(x, str) and HOSTED.match(x) for x in labels)


def test_nightly_matrix_comes_from_matrix_toml():
    wf = load("nightly.yml")
    jobs = wf["jobs"]
    cells = jobs["cells"]
    # hud: one relay call per cell; multinode: the multinode tier's cells, only when asked
    assert {n for n, j in jobs.items() if "strategy" in j} == {"cells", "hud", "multinode"}
    multinode = jobs["multinode"]
    assert multinode["strategy"]["matrix"] == "${{ fromJSON(needs.multinode-matrix.outputs.matrix) }}"
    (listed,) = [s for s in steps(jobs["multinode-matrix"]) if s.get("id") == "matrix"]
    assert listed["run"] == "nox -s matrix -- --json --tier multinode --github-output"
    assert "inputs.multinode" in jobs["multinode-matrix"]["if"]
    expr = re.fullmatch(r"\$\{\{\s*fromJSON\(needs\.([\w-]+)\.outputs\.matrix\)\s*\}\}", cells["strategy"]["matrix"])
    assert expr, cells["strategy"]["matrix"]
    producer_name = expr.group(1)
    needs = cells["needs"] if isinstance(cells["needs"], list) else [cells["needs"]]
    assert producer_name in needs
    producer = jobs[producer_name]
    assert producer["runs-on"] == "ubuntu-latest"
    step_id = re.fullmatch(r"\$\{\{\s*steps\.([\w-]+)\.outputs\.matrix\s*\}\}", producer["outputs"]["matrix"]).group(1)
    (step,) = [s for s in steps(producer) if s.get("id") == step_id]
    assert step["run"] == 'nox -s matrix -- --json --tier "$TIER" --github-output'
    assert step["env"]["TIER"] == "${{ inputs.tier || 'nightly' }}"

    assert cells["runs-on"] == "${{ matrix.runner }}"
    assert cells["env"]["CELL"] == "${{ matrix.cell }}"
    runs = "\n".join(s.get("run", "") for s in steps(cells))
    assert 'nox -s images -- --cell "$CELL"' in runs
    assert 'nox -s dist_tests -- --cell "$CELL" --backend docker --tier "$TIER"' in runs
    # a sharded tier: one job per cell and share, each passing its share; one HUD relay per cell
    assert cells["env"]["SHARD"] == "${{ matrix.shard }}" and '${SHARD:+--shard "$SHARD"}' in runs
    assert jobs["hud"]["strategy"]["matrix"] == "${{ fromJSON(needs.matrix.outputs.cell_matrix) }}"
    assert producer["outputs"]["cell_matrix"] == f"${{{{ steps.{step_id}.outputs.cell_matrix }}}}"
    (upload,) = [s for s in steps(cells) if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert "${{ matrix.cell }}" in upload["with"]["name"] and "matrix.shard_name" in upload["with"]["name"]

    # Every matrix key the job reads exists in every entry matrix.toml gives, for every
    # tier the workflow can be asked to run.
    used = set(re.findall(r"(?<![\w.])matrix\.(\w+)", json.dumps(cells)))
    assert used >= {"cell", "runner"}
    offered = triggers(wf)["workflow_dispatch"]["inputs"]["tier"]["options"]
    assert set(offered) <= set(MATRIX.tiers)
    sharding = {"shard", "shard_name"}  # only a sharded tier's entries have them ('' elsewhere)
    for tier in offered:
        for entry in MATRIX.actions_include(tier):
            assert used - sharding <= entry.keys(), (tier, used - entry.keys())
            assert sharding <= entry.keys() or MATRIX.tiers[tier].shards == 1
        assert {e["cell"] for e in MATRIX.actions_include(tier)} == {e["cell"] for e in MATRIX.actions_include(
            tier, sharded=False)}


def test_matrix_session_output_reaches_gpu_and_npu_runners():
    proc = subprocess.run([sys.executable, "-m", "distci", "matrix", "--json", "--tier", "nightly"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    include = json.loads(proc.stdout)["include"]
    assert include == MATRIX.actions_include("nightly")
    runners = {tuple(e["runner"]) for e in include}
    assert ("self-hosted", "linux", "cuda", "gpu-2") in runners
    assert ("self-hosted", "linux", "npu") in runners
    for entry in include:
        assert entry["runner"] == list(MATRIX.cell(entry["cell"]).runner)


def test_self_hosted_labels_are_declared_for_actionlint():
    config = yaml.safe_load((REPO / ".github" / "actionlint.yaml").read_text())
    declared = set(config["self-hosted-runner"]["labels"])
    builtin = {"self-hosted", "linux", "windows", "macos", "x64", "arm", "arm64"}
    for acc in MATRIX.accelerators.values():
        if "self-hosted" in acc.runner:
            assert set(acc.runner) - builtin <= declared, acc.name


def test_runner_labels_are_written_only_in_matrix_toml():
    """A job runs on a literal GitHub-hosted label, or on labels that come from matrix.toml."""
    allowed = {"${{ matrix.runner }}", "${{ fromJSON(needs.resolve.outputs.runner) }}"}
    for name, wf in workflows().items():
        for job_name, job in wf["jobs"].items():
            runs_on = job["runs-on"]
            assert not is_self_hosted_capable(runs_on) or runs_on in allowed, (name, job_name, runs_on)


def test_pull_requests_never_reach_self_hosted_runners():
    for name, wf in workflows().items():
        events = set(triggers(wf))
        assert "pull_request_target" not in events, name
        self_hosted = [j for j, job in wf["jobs"].items() if is_self_hosted_capable(job["runs-on"])]
        if events & UNTRUSTED_EVENTS:
            assert not self_hosted, (name, self_hosted)
        if self_hosted:
            assert events <= {"schedule", "workflow_dispatch", "push"}, name
            if "push" in events:
                assert triggers(wf)["push"] == {"branches": ["main"]}, name
    assert "pull_request" in triggers(load("pr.yml"))


def test_pr_workflow_runs_the_pr_tier_on_hosted_runners():
    for cell in MATRIX.select(tier="pr"):
        assert not is_self_hosted_capable(list(cell.runner)), cell.id
    wf = load("pr.yml")
    runs = "\n".join(s.get("run", "") for job in wf["jobs"].values() for s in steps(job))
    assert "nox -s tests" in runs
    assert "nox -s lint" in runs
    assert "nox -s dist_tests -- --tier pr" in runs


def test_self_hosted_jobs_hold_read_permissions_only():
    for name, wf in workflows().items():
        for job_name, job in wf["jobs"].items():
            if is_self_hosted_capable(job["runs-on"]):
                assert set(job["permissions"].values()) <= {"read", "none"}, (name, job_name)


def test_every_action_is_pinned_by_commit_sha():
    for path in sorted(WORKFLOWS.glob("*.y*ml")):
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            for step in steps(job):
                if "uses" in step:
                    assert SHA_PIN.match(step["uses"]), (path.name, step["uses"])
        for line in path.read_text().splitlines():
            if re.match(r"\s*(- )?uses:", line):
                # pytorch/test-infra tags no releases of its actions: its pin names the branch.
                version = r"main" if "pytorch/test-infra/" in line else r"v\d+\.\d+\.\d+"
                assert re.search(rf"@[0-9a-f]{{40}} # {version}$", line), (path.name, line)


def test_permissions_timeouts_concurrency_and_retention():
    for name, wf in workflows().items():
        assert wf["permissions"] == {} or set(wf["permissions"].values()) <= {"read", "none"}, name
        assert wf["concurrency"]["group"], name
        for job_name, job in wf["jobs"].items():
            assert isinstance(job.get("timeout-minutes"), int) and job["timeout-minutes"] > 0, (name, job_name)
            assert "permissions" in job, (name, job_name)
            for step in steps(job):
                uses = step.get("uses", "")
                if uses.startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False, (name, job_name)
                if uses.startswith(("actions/upload-artifact@", "actions/upload-pages-artifact@")):
                    assert step["with"]["retention-days"] > 0, (name, job_name)


def test_no_expression_is_interpolated_into_scripts():
    for name, wf in workflows().items():
        for job in wf["jobs"].values():
            for step in steps(job):
                assert "${{" not in step.get("run", ""), (name, step.get("name"))


# The one index a workflow names: hosted CPU jobs take torch from PyTorch's CPU index
# (PyPI's torch is the CUDA build), the rest from PyPI; everything else is configuration.
PR_INDEXES = {"DISTCI_INDEX_URL": "https://download.pytorch.org/whl/cpu",
              "DISTCI_EXTRA_INDEX_URLS": "https://pypi.org/simple"}


def test_index_urls_are_repository_variables():
    config = yaml.safe_load((REPO / ".github" / "actionlint.yaml").read_text())
    pr = load("pr.yml")
    assert pr["env"]["DISTCI_INDEX_URL"] == PR_INDEXES["DISTCI_INDEX_URL"]
    assert pr["env"]["DISTCI_EXTRA_INDEX_URLS"] == PR_INDEXES["DISTCI_EXTRA_INDEX_URLS"]
    tests_env = next(s for s in steps(pr["jobs"]["tests"]) if s.get("run") == "nox -s tests")["env"]
    assert tests_env == {"PIP_INDEX_URL": "${{ env.DISTCI_INDEX_URL }}",
                         "PIP_EXTRA_INDEX_URL": "${{ env.DISTCI_EXTRA_INDEX_URLS }}"}
    for path in sorted(WORKFLOWS.glob("*.y*ml")):
        text = path.read_text()
        if path.name == "pr.yml":
            for url in PR_INDEXES.values():
                text = text.replace(url, "")
        assert not re.search(r"https?://", text), path.name
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            for key, value in job.get("env", {}).items():
                if key.startswith("DISTCI_") and ("URL" in key or key.endswith(("FIND_LINKS", "IMAGE"))):
                    assert path.name == "pr.yml" and "vars." not in str(value), (path.name, key)
            for name in exported_vars(job):
                assert name in config["config-variables"], (path.name, name)


def exported_vars(job: dict[str, Any]) -> list[str]:
    """The repository variables a job takes through tools/ci/export-vars.py."""
    return [name for s in steps(job) if s.get("run", "").startswith(EXPORT) for name in s["run"].split()[1:]]


EXPORT = "tools/ci/export-vars.py"
# What a self-hosted runner's `.env` may set (docs/runners.md, "Caches that survive jobs" and
# "Base images"): an unset repository variable must never override it with "".
RUNNER_ENV = {"DISTCI_WHEELHOUSE_ROOT", "DISTCI_BASE_IMAGE", "DISTCI_CPU_BASE_IMAGE", "DISTCI_CUDA_BASE_IMAGE",
              "DISTCI_NPU_BASE_IMAGE", "DISTCI_INDEX_URL", "DISTCI_EXTRA_INDEX_URLS", "DISTCI_FIND_LINKS"}


def test_repository_variables_never_override_the_runner_env_with_empty_values():
    """`env: X: ${{ vars.X }}` is "" when X is unset, which beats the runner's `.env`: no job
    or step sets a variable from `vars.` directly; self-hosted jobs export the set ones."""
    for name, wf in workflows().items():
        for job_name, job in wf["jobs"].items():
            scopes = [job.get("env", {})] + [s.get("env", {}) for s in steps(job)]
            direct = [k for env in scopes for k, v in env.items() if re.search(r"\bvars\.", str(v))]
            assert direct == [], (name, job_name, direct)
            exporters = [s for s in steps(job) if s.get("run", "").startswith(EXPORT)]
            for step in exporters:
                assert step["env"] == {"VARS": "${{ toJSON(vars) }}"}, (name, job_name)
            if is_self_hosted_capable(job["runs-on"]):
                assert RUNNER_ENV <= set(exported_vars(job)), (name, job_name, RUNNER_ENV - set(exported_vars(job)))
                first_work = next(i for i, s in enumerate(steps(job)) if "run" in s)
                assert list(steps(job))[first_work]["run"].startswith(EXPORT), (name, job_name)


def _export(tmp_path, variables: dict[str, str], names: list[str]) -> subprocess.CompletedProcess[str]:
    env_file = tmp_path / "github_env"
    env_file.write_text("")
    env = {"PATH": "/usr/bin:/bin", "VARS": json.dumps(variables), "GITHUB_ENV": str(env_file)}
    return subprocess.run([str(REPO / EXPORT), *names], env=env, capture_output=True, text=True, timeout=30)


def test_export_vars_writes_only_the_set_variables(tmp_path):
    from jobsteps import _read_outputs

    proc = _export(tmp_path, {"DISTCI_WHEELHOUSE_ROOT": "", "DISTCI_INDEX_URL": "https://index.example/simple",
                              "DISTCI_BASE_IMAGE": "a\nb", "OTHER": "x"},
                   ["DISTCI_WHEELHOUSE_ROOT", "DISTCI_INDEX_URL", "DISTCI_BASE_IMAGE", "DISTCI_NPU_BASE_IMAGE"])
    assert proc.returncode == 0, proc.stderr
    assert _read_outputs(tmp_path / "github_env") == {"DISTCI_INDEX_URL": "https://index.example/simple",
                                                      "DISTCI_BASE_IMAGE": "a\nb"}
    assert "left to the runner's environment: DISTCI_WHEELHOUSE_ROOT DISTCI_NPU_BASE_IMAGE" in proc.stdout
    refused = _export(tmp_path, {"PATH": "/evil"}, ["PATH"])
    assert refused.returncode != 0 and "only DISTCI_* names" in refused.stderr


def _upload_steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in steps(job) if s.get("uses", "").startswith("actions/upload-artifact@")]


def test_cell_jobs_upload_their_runs_even_when_cancelled():
    """Every job that runs suites uploads the runs root it gave them, `always()`: a cancelled
    or timed-out job keeps its Interrupted record and JUnit (tests/test_job_cancel.py cancels one)."""
    seen = 0
    for name, wf in workflows().items():
        for job_name, job in wf["jobs"].items():
            runs = [s["run"] for s in steps(job) if "nox -s dist_tests" in s.get("run", "")]
            if not runs:
                continue
            seen += 1
            root = re.search(r'--runs-root "\$RUNNER_TEMP/(\w+)"', runs[0]).group(1)
            (upload,) = _upload_steps(job)
            assert _is_always(upload), (name, job_name, upload.get("if"))
            assert upload["with"]["path"].rstrip("/") == f"${{{{ runner.temp }}}}/{root}", (name, job_name)
    assert seen == 2  # nightly's cells, pr's pr-tier
    bisect = load("bisect.yml")["jobs"]["bisect"]
    assert all(_is_always(s) for s in _upload_steps(bisect))


JUNIT_ACTION = "mikepenz/action-junit-report@"


def test_junit_of_every_run_is_shown_in_the_run_ui():
    """A pinned JUnit reporter reads the JUnit files where the jobs put them, from hosted
    jobs only, without a check run (annotate_only: a fork's token cannot write checks)."""
    from distci.rundir import JUNIT_FILE

    where = {"pr.yml": ("pr-tier", "${{ runner.temp }}/runs/*/" + JUNIT_FILE),
             "nightly.yml": ("aggregate", "${{ runner.temp }}/artifacts/*/*/" + JUNIT_FILE)}
    for name, (job_name, path) in where.items():
        job = load(name)["jobs"][job_name]
        assert not is_self_hosted_capable(job["runs-on"])
        (report,) = [s for s in steps(job) if s.get("uses", "").startswith(JUNIT_ACTION)]
        assert _is_always(report) and report["with"]["report_paths"] == path, (name, report)
        assert report["with"]["annotate_only"] is True and "checks" not in job["permissions"]
    download = next(s for s in steps(load("nightly.yml")["jobs"]["aggregate"]) if "download-artifact" in s.get("uses", ""))
    assert download["with"]["pattern"] == "run-*" and download["with"]["path"] == "${{ runner.temp }}/artifacts"


def test_the_required_check_is_the_pr_workflows_gate_job():
    """docs/runners.md names pr.yml's `gate` job as the required check; that job runs on pull
    requests, always (a skipped required check counts as passed), and judges the pr tier."""
    pr = load("pr.yml")
    gate = pr["jobs"]["gate"]
    assert "pull_request" in triggers(pr) and gate["name"] == "gate"
    assert _is_always({"if": gate["if"]}) and gate["needs"] == "pr-tier"
    runs = [s["run"] for s in steps(gate) if "run" in s]
    assert 'nox -s gate -- --tier pr --store "$RUNNER_TEMP/store.sqlite"' in runs
    (download,) = [s for s in steps(gate) if "download-artifact" in s.get("uses", "")]
    (upload,) = _upload_steps(pr["jobs"]["pr-tier"])
    assert download["with"]["name"] == upload["with"]["name"] and not download.get("continue-on-error")
    doc = (REPO / "docs" / "runners.md").read_text()
    assert "**Pull requests: require the check `gate`.**" in doc
    assert "Never make nightly.yml's `gate` a\nrequired check" in doc
    assert "make this job a **required check**" not in doc


def test_bisect_workflow_takes_what_the_aggregate_dispatches():
    wf = load("bisect.yml")
    inputs = triggers(wf)["workflow_dispatch"]["inputs"]
    plan = BisectPlan("cpu-cell", "suites/test_x.py::t", "torch", "2026-11-19", "2026-11-20")
    assert set(inputs) == set(plan.inputs(12))
    assert set(inputs["axis"]["options"]) == set(BISECT_AXES)
    assert set(triggers(wf)) == {"workflow_dispatch"}

    jobs = wf["jobs"]
    assert jobs["bisect"]["runs-on"] == "${{ fromJSON(needs.resolve.outputs.runner) }}"
    (lookup,) = [s for s in steps(jobs["resolve"]) if s.get("id") == "cell"]
    assert 'python -m distci aggregate cell -- "$CELL"' in lookup["run"]
    assert jobs["resolve"]["outputs"]["runner"] == "${{ steps.cell.outputs.runner }}"
    bisect_runs = "\n".join(s.get("run", "") for s in steps(jobs["bisect"]))
    assert "nox -s bisect --" in bisect_runs and '-- "$TEST_ID"' in bisect_runs
    record_runs = "\n".join(s.get("run", "") for s in steps(jobs["record"]))
    assert "python -m distci aggregate bisect-result" in record_runs


@pytest.mark.parametrize("cell", [c.id for c in MATRIX.cells])
def test_bisect_runs_on_the_runner_of_its_cell(cell):
    out = cell_outputs(cell, REPO / "matrix.toml")
    assert json.loads(out["runner"]) == list(MATRIX.cell(cell).runner)
    assert out["variant"] == MATRIX.cell(cell).variant


def _is_always(step: dict[str, Any]) -> bool:
    return str(step.get("if", "")).replace(" ", "") in ("${{always()}}", "always()")


def test_every_self_hosted_job_ends_by_removing_its_containers():
    for name, wf in workflows().items():
        for job_name, job in wf["jobs"].items():
            if not is_self_hosted_capable(job["runs-on"]):
                continue
            last = list(steps(job))[-1]
            assert _is_always(last), (name, job_name, last)
            assert last["run"] == 'nox -s teardown -- --cell "$CELL"', (name, job_name)
            assert "CELL" in {**job.get("env", {}), **last.get("env", {})}, (name, job_name)


def test_the_tier_gate_is_a_job_of_its_own_whose_failure_fails_the_run():
    jobs = load("nightly.yml")["jobs"]
    gate = jobs["gate"]
    assert "aggregate" in gate["needs"] and gate["runs-on"] == "ubuntu-latest"
    assert gate["env"]["TIER"] == "${{ needs.matrix.outputs.tier }}"
    (step,) = [s for s in steps(gate) if "nox -s gate" in s.get("run", "")]
    assert step["run"].startswith('nox -s gate -- --tier "$TIER" --store ')
    assert not step.get("continue-on-error") and "if" not in step
    assert "continue-on-error" not in gate


def test_only_the_hud_and_pages_jobs_may_mint_an_oidc_token():
    for name, wf in workflows().items():
        for job_name, job in wf["jobs"].items():
            if job.get("permissions", {}).get("id-token") == "write":
                assert (name, job_name) in {("nightly.yml", "hud"), ("nightly.yml", "deploy")}, (name, job_name)
                assert not is_self_hosted_capable(job["runs-on"])
    hud = load("nightly.yml")["jobs"]["hud"]
    (relay,) = [s for s in steps(hud) if "cross-repo-ci-relay-callback" in s.get("uses", "")]
    assert set(relay["with"]) >= {"status", "conclusion", "delivery-id", "event-type", "job-name", "test-results",
                                  "failed-tests-detail", "triage-verdict", "artifact-url"}
    for key, value in relay["with"].items():
        assert value == "completed" or value == f"${{{{ steps.row.outputs.{key} }}}}", key


def test_nightly_and_pr_steps_are_thin():
    """Every step that does work calls a nox session or a script of this repository, on one line."""
    for name in ("nightly.yml", "pr.yml"):
        for job_name, job in load(name)["jobs"].items():
            for step in steps(job):
                if "run" in step:
                    run = step["run"].strip()
                    assert "\n" not in run and run.startswith(("nox -s ", "tools/ci/")), (name, job_name, run)


def test_the_pr_tier_caches_its_wheelhouse_and_pip_downloads():
    job = load("pr.yml")["jobs"]["pr-tier"]
    (cache,) = [s for s in steps(job) if s.get("uses", "").startswith("actions/cache@")]
    assert ".distci/wheelhouse" in cache["with"]["path"] and "~/.cache/pip" in cache["with"]["path"]
    assert job["env"]["DISTCI_WHEELHOUSE_ROOT"] == "${{ github.workspace }}/.distci/wheelhouse"
    assert "hashFiles('matrix.toml'" in cache["with"]["key"]
