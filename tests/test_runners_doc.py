"""docs/runners.md: every distci command of the runner guide is one a test runs.

The guide's `sh` blocks hold two kinds of commands: the vendors' and the OS's (drivers,
Docker, the runner application: `VENDOR`), which no test here can run, and distci's.
Each of distci's must be exercised, with the options it shows:

- `nox -s SESSION -- ...` and `tools/ci/...`: a `run:` step of nightly.yml with the same
  options (tests/test_job_steps.py runs those steps in order as a non-root user);
- `python -m distci COMMAND ...`: a test that runs `distci("COMMAND", ...)` with them;
- `docker/base/make-base.sh`: the recipe distci.images runs to make the local base
  (ensure_local_base, called by the job-steps test and the image tests).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from conftest import REPO
from distci.images.base import BASE_RECIPE

DOC = REPO / "docs" / "runners.md"
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
