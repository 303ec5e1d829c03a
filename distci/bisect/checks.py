"""Checks: run the question in a candidate's environment and read the answer.

The check is a command read as `git bisect run` reads it: exit 0 good, 125 skip, any
other code from 1 to 127 bad; a code above 127 (a signal, a crashed shell) aborts the
bisect, as in git, since it says nothing about the candidate. A check that runs past its
timeout is its own outcome, `timeout`, read as skip (default) or bad (`on_timeout`): a
slow machine says nothing about a commit, but a hang introduced by one does.

Where the command runs is a Runner's business: LocalRunner starts it here with the
candidate venv first on PATH; a runner for a cell's docker image (the container seam)
implements the same `run(...)` and the checks do not change.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping, Protocol

from distci.errors import BisectError
from distci.harness import procs

SKIP_CODE = 125
OnTimeout = Literal["skip", "bad"]


_ERROR_LINE = re.compile(r"^(?:E\s+)?[\w.]*(?:Error|Exception|Failure|Failed)\b")
_PYTEST_TOTALS = re.compile(r"^=*\s*(\d+ \w+(?:, \d+ \w+)*) in [\d.]+s(?: \(\d+:\d\d:\d\d\))?\s*=*$")
"""pytest's last line ("1 failed, 2 warnings in 61.20s (0:01:01)"): its duration, and the
(h:mm:ss) pytest adds past a minute, say how loaded the machine was, not what failed."""


def _outcomes_only(line: str) -> str:
    totals = _PYTEST_TOTALS.match(line)
    if totals is None:
        return line
    return ", ".join(part for part in totals.group(1).split(", ") if not part.split(" ", 1)[1].startswith("warning"))


def failure_signature(detail: str) -> tuple[str, str]:
    """What makes two failures the same failure: (the first line, e.g. `exit 1`; the last
    line that names an error, else the last line), numbers blanked (pids, times, sizes
    vary) and pytest's totals line without its duration and warnings. A probe counts as
    failing like the original only when the signatures match (python-diff's overlays, the
    compiler bisector's steps)."""
    lines = [re.sub(r"\d+", "#", _outcomes_only(line.strip())) for line in detail.strip().splitlines() if line.strip()]
    if not lines:
        return ("", "")
    errors = [line for line in lines[1:] if _ERROR_LINE.match(line)]
    return (lines[0], errors[-1] if errors else lines[-1] if len(lines) > 1 else "")


def outcome_from_exit(code: int) -> str:
    """A check's exit code read as `git bisect run` reads it."""
    if code == 0:
        return "good"
    if code == SKIP_CODE:
        return "skip"
    if 1 <= code <= 127:
        return "bad"
    raise BisectError(f"the check exited with {code}: codes above 127 (or a signal) abort the "
                      "bisect, as with git bisect run; wrap the command to exit 1 for a crash")


@dataclass(frozen=True)
class RunOutput:
    """What one run of a command did: exit code (None when it timed out) and output."""

    code: int | None
    output: str


class Runner(Protocol):
    """Runs a check's command in a candidate's environment."""

    def run(self, command: str, *, venv: Path, env: Mapping[str, str], cwd: Path | None,
            timeout: float | None) -> RunOutput: ...


class LocalRunner:
    """On this machine, the candidate venv first on PATH, in its own process group: whatever
    the command leaves behind (rank workers, servers) is killed with it."""

    def run(self, command: str, *, venv: Path, env: Mapping[str, str], cwd: Path | None,
            timeout: float | None) -> RunOutput:
        full = dict(os.environ, **env)
        full.pop("PYTHONHOME", None)
        full["VIRTUAL_ENV"] = str(venv)
        full["PATH"] = f"{venv / 'bin'}{os.pathsep}{full.get('PATH', '')}"
        proc = subprocess.Popen(command, shell=True, cwd=cwd, env=full, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
            code: int | None = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        except subprocess.TimeoutExpired:
            procs.kill_group(proc)
            out, _ = proc.communicate()
            code = None
        finally:
            procs.kill_group(proc)
        return RunOutput(code, out.decode(errors="replace") if isinstance(out, bytes) else (out or ""))


@dataclass
class CommandCheck:
    """The check of a probe: a shell command run by `runner` in the candidate's venv.

    `exit_map` reads some exit codes first, e.g. pytest's 2-5 (interrupted, internal or
    usage error, nothing collected) as skip: they say nothing about the candidate.
    """

    command: str
    cwd: Path | None = None
    timeout: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    exit_map: Mapping[int, str] = field(default_factory=dict)
    on_timeout: OnTimeout = "skip"
    runner: Runner = field(default_factory=LocalRunner)

    def run(self, venv: Path) -> tuple[str, str, str]:
        """(outcome, reason, last lines of output); reason is "timeout" for a timeout."""
        done = self.runner.run(self.command, venv=venv, env=self.env, cwd=self.cwd,
                               timeout=self.timeout)
        if done.code is None:
            return self.on_timeout, "timeout", f"timeout after {self.timeout}s\n" + tail(done.output)
        return self.outcome(done.code, done.output), "", f"exit {done.code}\n" + tail(done.output)

    def outcome(self, code: int, output: str) -> str:
        """What an exit code (and, for subclasses, the output) says about the candidate."""
        return self.exit_map.get(code) or outcome_from_exit(code)


# pytest: 2 interrupted, 3 internal error, 4 usage error, 5 nothing collected (the test
# does not exist at this candidate): none of them is an answer about the candidate.
PYTEST_EXIT_MAP = {2: "skip", 3: "skip", 4: "skip", 5: "skip"}
_PYTEST_SUMMARY = re.compile(r"^=*\s*(?:\d+ \w+(?:, )?)+ in [\d.]+s", re.MULTILINE)


@dataclass
class PytestCheck(CommandCheck):
    """A pytest run read as pytest's exit codes say: 0 good, 1 bad, 2-5 skip.

    Exit 0 with nothing passed (the test skipped itself: no such device, a marker the
    candidate cannot meet) is `skip` too: a skipped test says nothing about the
    candidate, and reading it as good would steer the search.
    """

    exit_map: Mapping[int, str] = field(default_factory=lambda: dict(PYTEST_EXIT_MAP))
    run_dir: Path | None = None

    def run(self, venv: Path) -> tuple[str, str, str]:
        """As CommandCheck; with `run_dir` (the harness's --distci-run-dir) the detail
        starts with what the harness recorded: each test's outcome and error."""
        results = self.run_dir / "results.jsonl" if self.run_dir else None
        offset = results.stat().st_size if results and results.exists() else 0
        outcome, reason, detail = super().run(venv)
        if results and results.exists():
            with results.open("rb") as fh:
                fh.seek(offset)
                recorded = [_recorded(line) for line in fh.read().decode(errors="replace").splitlines()]
            detail = "".join(line + "\n" for line in recorded if line) + detail
        return outcome, reason, detail

    def outcome(self, code: int, output: str) -> str:
        seen = super().outcome(code, output)
        if seen != "good":
            return seen
        summaries = _PYTEST_SUMMARY.findall(output)
        return "good" if summaries and " passed" in summaries[-1] else "skip"


def _recorded(line: str) -> str:
    """One harness result as a line or three: test id, outcome, the error's first lines."""
    try:
        record = json.loads(line)
    except ValueError:
        return ""
    message = [text for text in str(record.get("message", "")).splitlines() if text.strip()][:3]
    return f"{record.get('test_id')}: {record.get('outcome')}" + "".join(f"\n  {m}" for m in message)


def tail(text: bytes | str | None, lines: int = 20) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-lines:])
