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
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from distci.images.base import BASE_RECIPE

DOC = REPO / "docs" / "runners.md"
CPU_CELL_ID = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
# The first word of a vendor's or the OS's command (after sudo and VAR=value).
VENDOR = {"apt-get", "usermod", "nvidia-smi", "nvidia-ctk", "systemctl", "npu-smi", "getent", "./config.sh",
          "./run.sh", "./svc.sh"}
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

# What a person types for each placeholder of the guide's commands.
PLACEHOLDERS = {"<owner>": "example", "<repo>": "distci", "<org>": "example-org", "<registration-token>": "AAAAREGTOKEN",
                "<runner-user>": "runner", "<version>": "24.1.rc3", "<debian-mirror-url>": "http://mirror.invalid/debian",
                "<hash>": "0123abcd", "<run-id>": "123456", "<attempt>": "1", "<cell-id>": CPU_CELL_ID}
STEPS_HEADING = "## Setting up a self-hosted runner, step by step"
# The machine kinds the guide sets up: the sections each skips, the label its registration carries.
KINDS = {"cuda": ("(Ascend NPU)", "cuda"), "npu": ("(CUDA)", "npu")}
STUB = Path(__file__).with_name("runnerstubs.py")


def guide_steps(kind: str, scope: str) -> list[str]:
    """The commands a person runs, in order, to set up one `kind` machine for a `scope`
    (repository or organization): the step-by-step sections, minus the other device's,
    and the registration lines of this kind and scope."""
    text = DOC.read_text()
    body = text[text.index(STEPS_HEADING):]
    body = body[: body.index("\n## ", len(STEPS_HEADING))]
    skip, label = KINDS[kind]
    out = []
    for section in re.split(r"^### ", body, flags=re.M)[1:]:
        if skip in section.splitlines()[0]:
            continue
        for block in re.findall(r"^\s*```sh\n(.*?)^\s*```", section, re.S | re.M):
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


def walk(commands: list[str], home: Path) -> list[tuple[str, int, str]]:
    """Runs each command in bash from a runner directory, vendor tools replaced by the stubs of
    tests/runnerstubs.py (which check arguments as the tools do); distci's own commands are
    recorded here and run for real by the tests that test_every_distci_command_... names."""
    bindir = home / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    for name in ("sudo", "apt-get", "usermod", "nvidia-smi", "nvidia-ctk", "systemctl", "npu-smi", "getent", "nox",
                 "python"):
        stub = bindir / name
        stub.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "{name}" "$@"\n')
        stub.chmod(0o755)
    runner_dir = home / "actions-runner"
    runner_dir.mkdir(exist_ok=True)
    done = []
    for command in commands:
        text = command
        for placeholder, value in PLACEHOLDERS.items():
            text = text.replace(placeholder, value)
        left = re.findall(r"<[\w-]+>", text)
        assert not left, f"{command}: placeholders the guide does not explain: {left}"
        for word in _words(text):
            if "/" in word and not word.startswith(("-", "/", "http")) and not (runner_dir / word).exists():
                path = runner_dir / word  # a file the vendor's download or the checkout provides
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "{word}" "$@"\n')
                path.chmod(0o755)
                break
        env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(home), "CELL": CPU_CELL_ID, "RUNNER_TEMP": str(home),
               "DISTCI_STUB_LOG": str(home / "calls.log")}
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", text], cwd=runner_dir,
                              env=env, capture_output=True, text=True, timeout=60)
        done.append((command, proc.returncode, proc.stdout + proc.stderr))
    return done


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_following_the_guide_for_a_repository_fails_no_command(kind, tmp_path):
    commands = guide_steps(kind, "repository")
    registrations = [c for c in commands if c.startswith("./config.sh")]
    assert len(registrations) == 1 and "--runnergroup" not in registrations[0], registrations
    assert commands.index(registrations[0]) < commands.index("./run.sh")
    failed = [(c, rc, out) for c, rc, out in walk(commands, tmp_path) if rc != 0]
    assert failed == [], failed
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert any(c.startswith("config.sh ") for c in calls) and "run.sh" in calls


def test_following_the_guide_for_an_organization_uses_its_runner_group(tmp_path):
    commands = guide_steps("cuda", "organization")
    (registration,) = [c for c in commands if c.startswith("./config.sh")]
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
