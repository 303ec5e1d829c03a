"""docs/runners.md: every distci command of the runner guide is one a test runs.

The guide's `sh` blocks hold two kinds of commands: the vendors' and the OS's (drivers,
Docker, the runner application: `VENDOR`), which no test here can run, and distci's.
Each of distci's must be exercised, with the options it shows:

- `nox -s SESSION -- ...` and `tools/ci/...`: a `run:` step of nightly.yml with the same
  options (tests/test_job_steps.py runs those steps in order as a non-root user);
- `python -m distci COMMAND ...`: a test that runs `distci("COMMAND", ...)` with them;
- `docker/base/make-base.sh`: the recipe distci.images runs to make the local base
  (ensure_local_base, called by the job-steps test and the image tests).

And the guide is walked as written: the step-by-step commands for one CUDA or one Ascend
machine, registered to a repository (or an organization), run in order in a runner
directory, each vendor tool replaced by a stub that fails where the tool would
(tests/runnerstubs.py: the runner's config.sh options, run.sh before config.sh, ...).
The files it shows (```` ```ini file=PATH ````: the runner's `.env`, the supervisor's
credential file, the proxies) are written where it says, under the walk's home. A fleet
set up that way, long-lived or ephemeral, must take every job a nightly queues on its
labels, with registration tokens that expire after an hour and runners that take one job.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from distci.images.base import BASE_RECIPE, PUBLIC_BASES
from distci.matrix import load_matrix
from runnerstubs import IDLE, new_fleet

DOC = REPO / "docs" / "runners.md"
CPU_CELL_ID = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
# The first word of a vendor's or the OS's command (after sudo and VAR=value).
VENDOR = {"apt-get", "usermod", "nvidia-smi", "nvidia-ctk", "systemctl", "npu-smi", "getent", "./config.sh",
          "./run.sh", "./svc.sh", "chmod", "cp", "helm", "kubectl"}
VENDOR_PREFIXES = ("./Ascend-hdk-",)


def doc_commands() -> list[str]:
    blocks = re.findall(r"^\s*```sh\n(.*?)^\s*```", DOC.read_text(), re.S | re.M)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _words(command: str) -> list[str]:
    words = shlex.split(command)
    while words and (words[0] == "sudo" or re.fullmatch(r"[A-Z_]+=.*", words[0])):
        words.pop(0)
    return words


def _options(words: list[str]) -> set[str]:
    return {w.split("=", 1)[0] for w in words if w.startswith("-") and w != "--"}


def nightly_runs() -> list[str]:
    wf = yaml.safe_load((REPO / ".github" / "workflows" / "nightly.yml").read_text())
    return [s["run"] for job in wf["jobs"].values() for s in job.get("steps", []) if "run" in s]


def distci_calls() -> list[list[str]]:
    """The string arguments of `distci("COMMAND", "--opt", value, ...)` calls in the tests."""
    calls = []
    for path in sorted((REPO / "tests").glob("test_*.py")):
        for match in re.finditer(r"\bdistci\((\"[^)]*)\)", path.read_text()):
            calls.append(re.findall(r"\"([^\"]*)\"", match.group(1)))
    return calls


def test_the_guide_has_distci_and_vendor_commands():
    kinds = {"vendor" if _is_vendor(_words(c)) else "distci" for c in doc_commands()}
    assert kinds == {"vendor", "distci"}


def _is_vendor(words: list[str]) -> bool:
    return bool(words) and (words[0] in VENDOR or words[0].startswith(VENDOR_PREFIXES))


def test_every_distci_command_of_the_guide_is_exercised():
    runs = [shlex.split(r) for r in nightly_runs()]
    calls = distci_calls()
    unexercised = []
    for command in doc_commands():
        words = _words(command)
        if _is_vendor(words):
            continue
        if words[:2] == ["nox", "-s"] or words[0].startswith("tools/ci/"):
            same = [r for r in runs if r[: len(words[:3 if words[0] == "nox" else 1])] ==
                    words[: 3 if words[0] == "nox" else 1]]
            ok = any(_options(words) <= _options(r) for r in same)
        elif words[:3] == ["python", "-m", "distci"]:
            ok = any(c and c[0] == words[3] and _options(words[4:]) <= _options(c) for c in calls)
        elif words[0] == str(BASE_RECIPE.relative_to(REPO)):
            ok = Path(REPO / words[0]).is_file()  # run by distci.images.base.ensure_local_base
        else:
            ok = False
        if not ok:
            unexercised.append(command)
    assert unexercised == [], "runners.md commands no test runs (add the test, or mark the command a vendor's)"


# ---------------------------------------------------------------- the guide, walked

# What a person types for each placeholder of the guide's commands (the walk adds the paths
# of its home: <cache-dir>, <runner-dir>, <distci-checkout>).
PLACEHOLDERS = {"<owner>": "example", "<repo>": "distci", "<org>": "example-org", "<registration-token>": "AAAAREGTOKEN",
                "<runner-user>": "runner", "<version>": "24.1.rc3", "<debian-mirror-url>": "http://mirror.invalid/debian",
                "<hash>": "0123abcd", "<run-id>": "123456", "<attempt>": "1", "<cell-id>": CPU_CELL_ID,
                "<proxy-url>": "http://proxy.invalid:3128", "<fine-grained-token>": "github_pat_WALK"}
STEPS_HEADING = "## Setting up a self-hosted runner, step by step"
# The machine kinds the guide sets up: the sections each skips, the label its registration carries.
KINDS = {"cuda": ("(Ascend NPU)", "cuda"), "npu": ("(CUDA)", "npu")}
# How the runner is kept: the section each mode skips.
MODES = {"long-lived": "(ephemeral)", "ephemeral": "(long-lived)"}
STUB = Path(__file__).with_name("runnerstubs.py")
BLOCK = re.compile(r"^[ \t]*```(\w+)(?: file=(\S+))?\n(.*?)^[ \t]*```", re.S | re.M)


def guide_steps(kind: str, scope: str, mode: str = "long-lived") -> list:
    """What a person does, in order, to set up one `kind` machine for a `scope`
    (repository or organization) kept as `mode`: the step-by-step sections minus the
    other device's and the other mode's; the registration lines of this kind and scope;
    the files the guide shows, as (path, text)."""
    text = DOC.read_text()
    body = text[text.index(STEPS_HEADING):]
    body = body[: body.index("\n## ", len(STEPS_HEADING))]
    skip, label = KINDS[kind]
    out: list = []
    for section in re.split(r"^### ", body, flags=re.M)[1:]:
        heading = section.splitlines()[0]
        if skip in heading or MODES[mode] in heading:
            continue
        for lang, path, block in BLOCK.findall(section):
            if path:
                out.append((path, "\n".join(x.strip() for x in block.splitlines()) + "\n"))
                continue
            if lang != "sh":
                continue
            lines = [x.strip() for x in block.splitlines() if x.strip() and not x.strip().startswith("#")]
            registrations = [x for x in lines if _words(x)[0] == "./config.sh"]
            mine = [x for x in registrations if _registers(x, label, scope)]
            if registrations and not mine:
                continue  # the other scope's block
            out += [x for x in lines if x not in registrations or x in mine]
    return out


def _registers(command: str, label: str, scope: str) -> bool:
    words = _words(command)
    url = words[words.index("--url") + 1]
    return label in words[words.index("--labels") + 1].split(",") and _url_scope(url) == scope


def _url_scope(url: str) -> str:
    parts = url.split("://", 1)[-1].split("/")[1:]
    return "repository" if len(parts) == 2 else "organization"


def _stub(path: Path, name: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "{name}" "$@"\n')
    path.chmod(0o755)


def walk(steps: list, home: Path, github: Path | None = None) -> list[tuple[str, int, str]]:
    """Does each step from a runner directory where the runner application is unpacked:
    a file is written where the guide says (`~/` the home, `/` a fake root under it,
    else the runner directory); a command runs in bash, vendor tools replaced by the stubs
    of tests/runnerstubs.py (which check arguments as the tools do, and act on `github`,
    the fake GitHub, when given); distci's own commands are recorded here and run for real
    by the tests that test_every_distci_command_... names."""
    bindir = home / "bin"
    for name in ("sudo", "apt-get", "usermod", "nvidia-smi", "nvidia-ctk", "systemctl", "npu-smi", "getent", "nox",
                 "python", "gh"):
        _stub(bindir / name, name)
    runner_dir = home / "actions-runner"
    for name in ("config.sh", "run.sh", "svc.sh"):
        _stub(runner_dir / name, name)
    values = {**PLACEHOLDERS, "<cache-dir>": str(home / "cache"), "<runner-dir>": str(runner_dir),
              "<distci-checkout>": str(REPO)}
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(home), "CELL": CPU_CELL_ID, "RUNNER_TEMP": str(home),
           "DISTCI_STUB_LOG": str(home / "calls.log")}
    if github:
        env["DISTCI_STUB_GITHUB"] = str(github)
    done = []
    for step in steps:
        command = step if isinstance(step, str) else step[1]
        text = command
        for placeholder, value in values.items():
            text = text.replace(placeholder, value)
        left = re.findall(r"<[\w-]+>", text)
        assert not left, f"{command}: placeholders the guide does not explain: {left}"
        if not isinstance(step, str):
            where = step[0]
            path = home / where[2:] if where.startswith("~/") else home / "root" / where[1:] if where.startswith(
                "/") else runner_dir / where
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            done.append((where, 0, ""))
            continue
        for word in _words(text):
            if "/" in word and not word.startswith(("-", "/", "http", "~")) and not (runner_dir / word).exists():
                _stub(runner_dir / word, word)  # a file the vendor's download or the checkout provides
                break
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", text], cwd=runner_dir,
                              env=env, capture_output=True, text=True, timeout=120)
        done.append((command, proc.returncode, proc.stdout + proc.stderr))
    return done


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_following_the_guide_for_a_repository_fails_no_command(kind, tmp_path):
    commands = guide_steps(kind, "repository")
    registrations = [c for c in commands if isinstance(c, str) and c.startswith("./config.sh")]
    assert len(registrations) == 1 and "--runnergroup" not in registrations[0], registrations
    assert commands.index(registrations[0]) < commands.index("sudo ./svc.sh start")
    failed = [(c, rc, out) for c, rc, out in walk(commands, tmp_path) if rc != 0]
    assert failed == [], failed
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert any(c.startswith("config.sh ") for c in calls) and "svc.sh start" in calls
    assert (tmp_path / "actions-runner" / ".env").read_text().startswith("DISTCI_WHEELHOUSE_ROOT=")


def test_following_the_guide_for_an_organization_uses_its_runner_group(tmp_path):
    commands = guide_steps("cuda", "organization")
    (registration,) = [c for c in commands if isinstance(c, str) and c.startswith("./config.sh")]
    assert "--runnergroup distci" in registration
    assert [(c, rc) for c, rc, _ in walk(commands, tmp_path) if rc != 0] == []


def test_the_walk_fails_a_registration_the_runner_refuses(tmp_path):
    """The stubs are strict where the runner is: a runner group on a repository, an unknown
    option, run.sh before config.sh, a second registration of one runner directory."""
    repo = "./config.sh --url https://github.com/<owner>/<repo> --token <registration-token> --labels cuda"
    cases = {
        repo + " --runnergroup distci --unattended": "runner groups",
        repo + " --ephemral --unattended": "Unrecognized command-line input arguments",
        "./run.sh": "Not configured",
        "./config.sh --url https://github.com/<owner>/<repo> --labels cuda --unattended": "--token",
    }
    for i, (command, message) in enumerate(cases.items()):
        ((_, rc, out),) = walk([command], tmp_path / str(i))
        assert rc != 0 and message in out, (command, out)
    twice = walk([repo + " --unattended", repo + " --unattended"], tmp_path / "twice")
    assert [rc for _, rc, _ in twice][0] == 0 and twice[1][1] != 0 and "already configured" in twice[1][2]


# ---------------------------------------------------------------- a fleet takes a whole nightly

def nightly_self_hosted_jobs() -> list[list[str]]:
    """The `runs-on` labels of every job nightly.yml queues on self-hosted runners."""
    include = load_matrix(REPO / "matrix.toml").actions_include("nightly")
    return [job["runner"] for job in include if "self-hosted" in job["runner"]]


def _fleet(tmp_path: Path) -> Path:
    github = tmp_path / "github.json"
    new_fleet(github, nightly_self_hosted_jobs(), tokens=(PLACEHOLDERS["<registration-token>"],))
    return github


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_fleet_set_up_by_the_guide_takes_every_job_of_a_nightly(mode, tmp_path):
    """One CUDA machine and one Ascend machine, each set up by the guide for a repository,
    take every self-hosted job of the nightly (several per label), each job's environment
    has the `.env`'s caches, and the wheelhouse survives the checkout's clean: every job
    after a machine's first finds it warm."""
    jobs = nightly_self_hosted_jobs()
    assert len(jobs) > 2 and {"cuda", "npu"} <= {label for job in jobs for label in job}
    github = _fleet(tmp_path)
    for kind in sorted(KINDS):
        steps = guide_steps(kind, "repository", mode)
        if kind == "npu" and mode == "ephemeral":  # the guide's words: "On an Ascend machine DISTCI_RUNNER_LABELS=..."
            steps = [s if isinstance(s, str) else
                     (s[0], re.sub(r"DISTCI_RUNNER_LABELS=.*", "DISTCI_RUNNER_LABELS=self-hosted,linux,ARM64,npu", s[1]))
                     for s in steps]
        state = json.loads(github.read_text())  # this machine's admin gets a token now (valid one hour)
        state["tokens"][PLACEHOLDERS["<registration-token>"]] = state["clock"]
        github.write_text(json.dumps(state))
        failed = [(c, rc, out) for c, rc, out in walk(steps, tmp_path / kind, github) if rc != 0]
        assert failed == [], failed
    state = json.loads(github.read_text())
    assert state["queue"] == [], f"jobs left queued: {state['queue']}"
    assert len(state["taken"]) == len(jobs)
    for kind in sorted(KINDS):
        mine = [t for t in state["taken"] if kind in t["job"]]
        assert all({x.lower() for x in t["job"]} <= {x.lower() for x in t["labels"]} for t in mine)
        assert all("DISTCI_WHEELHOUSE_ROOT" in t["env"] for t in mine)
        assert [t["warm"] for t in mine] == [False] + [True] * (len(mine) - 1)
    if mode == "ephemeral":
        assert len({t["runner"] for t in state["taken"]}) == len(jobs)  # one registration per job
        assert all(u.get("state") in ("idle", "linked") for u in state["units"].values()), state["units"]


def test_the_stubs_model_one_job_runners_expiring_tokens_and_the_checkouts_clean(tmp_path):
    """What the fleet test would miss if the stubs were lenient: an ephemeral registration
    takes one job; a loop that keeps one registration token fails once it is an hour old;
    a just-in-time configuration is used once; a wheelhouse inside the checkout is lost."""
    repo = "./config.sh --url https://github.com/<owner>/<repo> --token <registration-token> --labels cuda,gpu-2"
    github = _fleet(tmp_path)
    walk([repo + " --ephemeral --unattended", "./run.sh"], tmp_path / "once", github)
    assert len(json.loads(github.read_text())["taken"]) == 1

    github = _fleet(tmp_path)
    loop = f"for i in 1 2 3 4; do {repo} --ephemeral --unattended; ./run.sh; done"
    ((_, rc, out),) = walk([loop], tmp_path / "loop", github)
    assert rc != 0 and "expired" in out and len(json.loads(github.read_text())["taken"]) == 2

    github = _fleet(tmp_path)
    jit = ("jit=$(GH_TOKEN=t gh api -X POST repos/example/distci/actions/runners/generate-jitconfig -f name=a "
           "-F runner_group_id=1 -f 'labels[]=self-hosted' -f 'labels[]=linux' -f 'labels[]=cuda' -f 'labels[]=gpu-2' "
           "--jq .encoded_jit_config); ./run.sh --jitconfig $jit; ./run.sh --jitconfig $jit")
    ((_, rc, out),) = walk([jit], tmp_path / "jit", github)
    assert rc != 0 and "used once" in out and len(json.loads(github.read_text())["taken"]) == 1
    nolabels = jit.replace(" -f 'labels[]=self-hosted' -f 'labels[]=linux'", "").rsplit(";", 1)[0]
    ((_, rc, _),) = walk([nolabels], tmp_path / "nolabels", github)
    assert rc == IDLE  # a just-in-time runner without self-hosted/linux matches no job

    github = _fleet(tmp_path)
    steps = [s for s in guide_steps("cuda", "repository") if not (isinstance(s, tuple) and s[0] == ".env")]
    walk(steps, tmp_path / "noenv", github)
    taken = json.loads(github.read_text())["taken"]
    assert len(taken) > 1 and not any(t["warm"] for t in taken)


def test_the_guides_base_images_are_the_code_s(tmp_path):
    """The pre-pull table of docs/runners.md is PUBLIC_BASES, row for row."""
    text = DOC.read_text()
    table = text[text.index("<!-- bases:"): text.index("<!-- /bases -->")]
    assert table.splitlines()[3:] == bases_rows(), "regenerate: python tests/test_runners_doc.py"


def bases_rows() -> list[str]:
    return [f"| {family} | {python} | `{base.name}` | "
            f"{f'`{base.digest}`' if base.digest else '**none: pin it yourself (below)**'} | {base.why} |"
            for (family, python), base in PUBLIC_BASES.items()]


# ---------------------------------------------------------------- actions-runner-controller scale sets

ARC_VALUES = sorted((REPO / "tools" / "runner").glob("arc-*.values.yaml"))
# The top-level keys the gha-runner-scale-set chart's values.yaml documents (set or commented
# out), chart 0.14.2 (actions/actions-runner-controller, charts/gha-runner-scale-set), read
# there; a key outside this set is silently ignored by helm, so a typo would go unseen.
ARC_CHART_VERSION = "0.14.2"
ARC_CHART_KEYS = {"githubConfigUrl", "scaleSetLabels", "githubConfigSecret", "proxy", "maxRunners", "minRunners",
                  "runnerGroup", "runnerScaleSetName", "githubServerTLS", "keyVault", "containerMode",
                  "listenerTemplate", "listenerMetrics", "template", "controllerServiceAccount",
                  "namespaceOverride", "annotations", "labels", "resourceMeta"}


def scale_sets() -> dict[str, dict]:
    return {path.name: yaml.safe_load(path.read_text()) for path in ARC_VALUES}


def test_the_scale_sets_take_every_self_hosted_job_of_the_nightly_and_release_tiers():
    """Every self-hosted job's runs-on labels are covered by one scale set's labels (its name
    plus scaleSetLabels), and every scale set serves some job."""
    sets = scale_sets()
    assert set(sets) == {"arc-cuda.values.yaml", "arc-npu.values.yaml"}
    labels = {name: {v["runnerScaleSetName"], *v["scaleSetLabels"]} for name, v in sets.items()}
    matrix = load_matrix(REPO / "matrix.toml")
    jobs = [tuple(job["runner"]) for tier in ("nightly", "release") for job in matrix.actions_include(tier)
            if "self-hosted" in job["runner"]]
    assert jobs
    served = {name: [job for job in jobs if set(job) <= have] for name, have in labels.items()}
    unserved = [job for job in jobs if not any(job in taken for taken in served.values())]
    assert unserved == [], f"no scale set has every label of these jobs' runs-on: {sorted(set(unserved))}"
    assert all(served.values()), f"a scale set no job targets: {served}"
    for name, values in sets.items():
        assert 0 <= values["minRunners"] <= values["maxRunners"] and values["maxRunners"] >= 1, name


def test_the_scale_set_values_use_only_the_charts_keys_and_reach_a_daemon_with_the_devices():
    for name, values in scale_sets().items():
        assert set(values) <= ARC_CHART_KEYS, (name, sorted(set(values) - ARC_CHART_KEYS))
        # The docker tier needs a daemon that sees the devices: not dind's, not kubernetes mode's.
        assert "containerMode" not in values, name
        spec = values["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        (runner,) = [c for c in spec["containers"] if c["name"] == "runner"]
        mounts = {m["name"]: m["mountPath"] for m in runner["volumeMounts"]}
        env = {e["name"]: e["value"] for e in runner["env"]}
        assert volumes["docker-sock"]["hostPath"]["path"] == mounts["docker-sock"] == "/var/run/docker.sock"
        assert env["DOCKER_HOST"] == "unix://" + mounts["docker-sock"]
        # The node's daemon bind-mounts run directories by path: the work directory is the node's, same path.
        assert volumes["work"]["hostPath"]["path"] == mounts["work"] == "/home/runner/_work"
        cache = env["DISTCI_WHEELHOUSE_ROOT"]
        assert any(cache.startswith(volumes[v]["hostPath"]["path"] + "/") for v in mounts if v != "docker-sock")


def test_the_guide_installs_each_scale_set_with_its_values_file():
    commands = [c for c in doc_commands() if c.startswith("helm install")]
    for path in ARC_VALUES:
        (install,) = [c for c in commands if f"-f {path.relative_to(REPO)}" in c]
        assert install.endswith(f"gha-runner-scale-set --version {ARC_CHART_VERSION}"), install
    assert any("gha-runner-scale-set-controller --version " + ARC_CHART_VERSION in c for c in commands)


if __name__ == "__main__":  # rewrite the guide's pre-pull table from PUBLIC_BASES
    text = DOC.read_text()
    head, rest = text.split("|---|---|---|---|---|\n", 1)
    rest = rest[rest.index("<!-- /bases -->"):]
    DOC.write_text(head + "|---|---|---|---|---|\n" + "\n".join(bases_rows()) + "\n" + rest)
