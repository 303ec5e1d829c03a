"""A cancelled cell job keeps its artifacts: pr.yml's pr-tier job, cancelled mid-run, as the
Cancel button does it (tests/jobsteps.py's Cancel: SIGINT, SIGTERM after 7.5 s, SIGKILL).

The job's steps run here in order (the pr tier's CPU cell in a venv; no Docker): once the
run has recorded its first result the job is cancelled; the upload and the JUnit report
steps (`always()`) still run, and the uploaded run directory holds the results so far,
its run.json and stack.json, and, when the controller closed the run within the runner's
10 s (SIGINT, 7.5 s, SIGTERM, 2.5 s, SIGKILL), the Interrupted record of the test in
flight and a JUnit file that says the same. (Measured on a loaded 2-core machine the
controller needs longer than that, so there it is killed first: reports/ says so.) Then the
gate job, which runs always, refuses to pass on a cancelled pr tier.

The workflow's PyTorch CPU index is replaced by this machine's pip configuration (index
URLs are configuration; the test machine may reach no other index).
"""

from __future__ import annotations

import json
import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import REPO
from jobsteps import PASS_THROUGH, SYSTEM_PATH, Cancel, Runner

from distci.harness.recorder import NOT_RUN
from test_job_steps import _copy_tree, actions_root  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def _first_result(temp: Path) -> bool:
    return any(p.stat().st_size > 0 for p in (temp / "runs").glob("*/results.jsonl"))


RUNNER_CACHE = REPO / ".distci" / "runner-cache"


@pytest.fixture(scope="module")
def machine_cache() -> Path:
    """What a self-hosted runner keeps between jobs: its tool cache (RUNNER_TOOL_CACHE, where
    tools/ci/install-nox.sh installs nox once a machine), the wheelhouse (the job's cache step
    restores it on hosted runners; jobsteps records that step without running it) and the stack
    environments built from it. It lives in the checkout's `.distci/`, as the wheelhouse and envs
    other tests reuse do: the jobs of this file and of every later run of it share it, as the
    jobs of one runner do. What they test is the cancel; a cold runner only delayed it (the
    first job's wheelhouse download and env build, and a nox install per job: ~25 CPU-s; the
    cold provisioning is tests/test_cellrun.py's default-cell test's to prove). A checkout's
    first run fills it. Each job still builds nox's controller venv in its workspace, as a job
    on a clean checkout does."""
    RUNNER_CACHE.mkdir(parents=True, exist_ok=True)
    return RUNNER_CACHE


def _pr_tier_runner(root: Path, cancel: Cancel, cache: Path) -> Runner:
    workspace = root / "workspace"
    workspace.mkdir()
    _copy_tree(workspace)
    home = root / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if PASS_THROUGH.match(k)}
    env.update({"PATH": SYSTEM_PATH, "HOME": str(home), "LANG": "C.UTF-8", "CI": "true", "GITHUB_ACTIONS": "true",
                "GITHUB_WORKSPACE": str(workspace), "GITHUB_REPOSITORY": "distci/distci",
                "GITHUB_SERVER_URL": "https://github.com", "RUNNER_OS": "Linux", "RUNNER_NAME": "distci-test-runner",
                "RUNNER_TOOL_CACHE": str(cache / "toolcache")})
    return Runner(workspace / ".github" / "workflows" / "pr.yml", workspace, root, user=None,
                  labels={"ubuntu-latest"}, inputs={}, variables={}, env=env, cancel=cancel,
                  env_override={"DISTCI_INDEX_URL": "", "DISTCI_EXTRA_INDEX_URLS": "",
                                "DISTCI_WHEELHOUSE_ROOT": str(cache / "wheelhouse"),
                                "DISTCI_ENV_ROOT": str(cache / "envs")})


STEP = "nox -s dist_tests -- --tier pr"


def test_a_cancelled_pr_tier_job_uploads_its_run_and_junit(actions_root, machine_cache):
    root = actions_root
    step = STEP
    runner = _pr_tier_runner(root, Cancel("pr-tier", step, _first_result), machine_cache)
    jobs = runner.wf["jobs"]
    started = time.monotonic()
    runner.jobs["pr-tier"] = [tier] = runner.run_job("pr-tier", jobs["pr-tier"])
    ran = tier.step(step)
    print(f"pr-tier: {tier.result} after {time.monotonic() - started:.0f}s; {step}: rc {ran.rc}\n{ran.output[-3000:]}")
    assert ran.cancelled, "the run ended before its first result: nothing was cancelled"
    assert tier.result == "cancelled"
    assert tier.step("Upload the runs").kind == "uses" and tier.step("Test report (JUnit)").kind == "uses"

    (run_dir,) = (runner.artifacts / "pr-runs").iterdir()
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert results, "the results so far were uploaded"
    print("uploaded:", [(r["test_id"].rpartition("::")[2], r["outcome"], r.get("error_signature")) for r in results])
    interrupted = [r for r in results if (r.get("error_signature") or "").startswith("Interrupted")]
    assert all(r["failure_kind"] == "infra" for r in interrupted), interrupted  # the test in flight, if one was
    # Closed within the grace, junit.xml says what results.jsonl says; killed before it
    # closed, it is the harness's file as the run went: the rest interrupted or not run.
    cases = {c.get("name"): c for c in ET.parse(run_dir / "junit.xml").getroot().iter("testcase")}
    recorded = {r["test_id"].rpartition("::")[2] for r in results}
    assert recorded <= set(cases), "every recorded test is in the JUnit file"
    for name in set(cases) - recorded:
        mark = cases[name].find("error") if cases[name].find("error") is not None else cases[name].find("skipped")
        assert mark is not None and mark.get("message", "").startswith(("Interrupted", NOT_RUN)), name
    info = json.loads((run_dir / "run.json").read_text())
    assert info["cell_id"] and (run_dir / "stack.json").is_file()

    runner.jobs["gate"] = [gate] = runner.run_job("gate", jobs["gate"])
    print("\n".join(f"--- {s.name} rc {s.rc}\n{s.output[-1500:]}" for s in gate.steps))
    assert gate.result == "failure" and gate.step("The pr tier ran to its end").rc == 1


def test_a_pr_tier_job_killed_at_once_uploads_a_junit_file_of_how_far_it_got(actions_root, machine_cache):
    """SIGKILL with no grace (a lost runner, a cancel past its grace): no handler runs and
    nothing closes the run, yet the uploaded junit.xml parses, holds every test that
    finished as results.jsonl says, and names the rest interrupted or not run."""
    runner = _pr_tier_runner(actions_root, Cancel("pr-tier", STEP, _first_result, kill_at_once=True), machine_cache)
    runner.jobs["pr-tier"] = [tier] = runner.run_job("pr-tier", runner.wf["jobs"]["pr-tier"])
    ran = tier.step(STEP)
    assert ran.cancelled and tier.result == "cancelled", ran.output[-3000:]
    (run_dir,) = (runner.artifacts / "pr-runs").iterdir()
    finished = {json.loads(line)["test_id"].rpartition("::")[2]: json.loads(line)["outcome"]
                for line in (run_dir / "results.jsonl").read_text().splitlines()}
    assert finished, "the cancel waited for a first result"
    suite = ET.parse(run_dir / "junit.xml").getroot().find("testsuite")  # parses: it was never half written
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    print(f"{len(finished)} finished, {len(cases)} in junit.xml")
    shown = {name: ("error" if c.find("error") is not None else "failed" if c.find("failure") is not None
                    else "skipped" if c.find("skipped") is not None else "passed") for name, c in cases.items()}
    # results.jsonl is the record and is written first; junit.xml is rewritten just after. A
    # kill between the two leaves the last recorded test shown as interrupted (never the
    # reverse: junit.xml never claims a result the record lacks). Only that one may differ.
    last = list(finished)[-1]
    differ = {n for n in finished if shown[n] != finished[n]}
    assert differ <= {last}, f"each finished test as results.jsonl says: {differ}"
    if differ:
        assert shown[last] == "error", f"{last}: {shown[last]}, recorded {finished[last]}"
        assert cases[last].find("error").get("message", "").startswith("Interrupted"), last
        print(f"killed between {last}'s record and the junit rewrite: shown as interrupted")
    rest = {n: c for n, c in cases.items() if n not in finished}
    assert rest, "the pr tier has more tests than the one that finished before the kill"
    messages = [(c.find("error") if c.find("error") is not None else c.find("skipped")).get("message", "")
                for c in rest.values()]
    assert all(m.startswith(("Interrupted", NOT_RUN)) for m in messages), messages
    assert sum(m.startswith("Interrupted") for m in messages) + len(differ) <= 1, "one test was in flight at most"
    assert int(suite.get("tests")) == len(cases) == len(finished) + len(rest)
