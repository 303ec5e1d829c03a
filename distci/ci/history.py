"""The JSONL history: a git branch of the repository (`distci-data`), append-only.

The JSONL files are the source of truth: `runs/<run-id>/` (results.jsonl, run.json,
stack.json, junit.xml) and `bisect/*.json`. A branch needs nothing but
`contents: write`, keeps every night forever, and reads with plain git. Tonight's run
directories are added (a results.jsonl that is not a continuation of the stored one is
refused), then the branch is pushed, retrying on a concurrent push. The SQLite store is
an index rebuilt from these files at each aggregate, so it is never persisted.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from distci.ci.ids import key
from distci.errors import InfraError
from distci.results import Result
from distci.rundir import RESULTS_FILE, RUN_FILES, RunDir

Log = Callable[[str], None]

DATA_BRANCH = "distci-data"
GIT_IDENTITY = ("github-actions[bot]", "41898282+github-actions[bot]@users.noreply.github.com")
PUSH_ATTEMPTS = 4


@dataclass
class HistoryUpdate:
    added: list[str] = field(default_factory=list)
    grown: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


class History:
    """The JSONL history: a checkout of the data branch (or a plain directory without remote).

    Authentication is an `http.extraheader` handed to git through GIT_CONFIG_* variables,
    so the token is on no command line and in no file; `actions/checkout` is not used
    for this branch because it may not exist yet (the first night creates it).
    """

    def __init__(self, path: Path, *, remote: str | None, branch: str = DATA_BRANCH, token: str | None = None,
                 log: Log = print) -> None:
        self.path = Path(path)
        self.remote = remote
        self.branch = branch
        self.token = token
        self.log = log

    @property
    def runs_dir(self) -> Path:
        return self.path / "runs"

    @property
    def bisect_dir(self) -> Path:
        return self.path / "bisect"

    def _env(self) -> dict[str, str]:
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
        if self.token and self.remote and self.remote.startswith("https://"):
            basic = base64.b64encode(f"x-access-token:{self.token}".encode()).decode()
            count = int(env.get("GIT_CONFIG_COUNT", "0") or 0)
            env.update({"GIT_CONFIG_COUNT": str(count + 1), f"GIT_CONFIG_KEY_{count}": "http.extraheader",
                        f"GIT_CONFIG_VALUE_{count}": f"AUTHORIZATION: basic {basic}"})
        return env

    def git(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        name, email = GIT_IDENTITY
        cmd = ["git", "-c", f"user.name={name}", "-c", f"user.email={email}", "-c", "commit.gpgsign=false",
               "-C", str(self.path), *args]
        proc = subprocess.run(cmd, env=self._env(), capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise InfraError(f"git {' '.join(args[:2])} failed in {self.path} (exit {proc.returncode}): "
                             f"{proc.stderr.strip()[-500:]}")
        return proc

    def fetch(self) -> None:
        """Check out the branch's newest commit (depth 1), or start it when it does not exist."""
        self.path.mkdir(parents=True, exist_ok=True)
        if self.remote is None:
            return
        if not (self.path / ".git").exists():
            self.git("init", "-q")
            self.git("remote", "add", "origin", self.remote)
        probe = self.git("ls-remote", "--exit-code", "--heads", "origin", self.branch, check=False)
        if probe.returncode == 2:
            self.log(f"aggregate: branch {self.branch} does not exist yet; starting it")
            self.git("symbolic-ref", "HEAD", f"refs/heads/{self.branch}")
            return
        if probe.returncode != 0:
            raise InfraError(f"cannot read {self.branch} from the data remote: {probe.stderr.strip()[-300:]}")
        self.git("fetch", "-q", "--depth=1", "origin", f"+refs/heads/{self.branch}:refs/remotes/origin/{self.branch}")
        self.git("checkout", "-q", "-f", "-B", self.branch, f"origin/{self.branch}")
        self.git("clean", "-qfdx")

    def read(self, relpath: str) -> bytes | None:
        """One file of the branch's tip, fetching only that blob (a partial clone), or None."""
        if self.remote is None:
            path = self.path / relpath
            return path.read_bytes() if path.is_file() else None
        self.path.mkdir(parents=True, exist_ok=True)
        if not (self.path / ".git").exists():
            self.git("init", "-q")
            self.git("remote", "add", "origin", self.remote)
        ref = f"refs/remotes/origin/{self.branch}"
        fetched = self.git("fetch", "-q", "--depth=1", "--filter=blob:none", "origin",
                           f"+refs/heads/{self.branch}:{ref}", check=False)
        if fetched.returncode != 0:
            raise InfraError(f"cannot read {self.branch} from the data remote: {fetched.stderr.strip()[-300:]}")
        shown = subprocess.run(["git", "-C", str(self.path), "show", f"{ref}:{relpath}"], env=self._env(),
                               capture_output=True)
        return shown.stdout if shown.returncode == 0 else None

    def add_runs(self, run_dirs: Iterable[Path]) -> HistoryUpdate:
        """Copy run directories in; append-only, like the files themselves."""
        update = HistoryUpdate()
        for src in run_dirs:
            run_id = run_id_of(src)
            dest = self.runs_dir / run_id
            new = (src / RESULTS_FILE).read_bytes() if (src / RESULTS_FILE).exists() else b""
            old = (dest / RESULTS_FILE).read_bytes() if (dest / RESULTS_FILE).exists() else None
            if old is not None and not new.startswith(old):
                update.refused.append(run_id)
                self.log(f"aggregate: refused {src}: its {RESULTS_FILE} rewrites the stored one of run {run_id}")
                continue
            state = "added" if old is None else ("unchanged" if old == new else "grown")
            dest.mkdir(parents=True, exist_ok=True)
            for name in RUN_FILES:
                if (src / name).exists():
                    shutil.copyfile(src / name, dest / name)
            getattr(update, state).append(run_id)
        return update

    def add_bisect(self, record: dict[str, Any]) -> Path:
        self.bisect_dir.mkdir(parents=True, exist_ok=True)
        name = key(record["cell_id"], record["test_id"], record["axis"], record["good"], record["bad"])
        path = self.bisect_dir / f"{name}.json"  # a re-run of the same bisect replaces its record
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        return path

    def publish(self, message: str, redo: Callable[[], Any]) -> bool:
        """Commit and push; on a rejected push, fetch the new tip, redo the writes, retry.

        Returns False when there was nothing to commit.
        """
        if self.remote is None:
            return False
        for attempt in range(PUSH_ATTEMPTS):
            readme = self.path / "README.md"
            if not readme.exists():
                readme.write_text(_DATA_README)
            self.git("add", "-A", ".")
            if self.git("diff", "--cached", "--quiet", check=False).returncode == 0:
                return False
            self.git("commit", "-q", "-m", message)
            pushed = self.git("push", "-q", "origin", f"HEAD:refs/heads/{self.branch}", check=False)
            if pushed.returncode == 0:
                return True
            self.log(f"aggregate: push to {self.branch} rejected (attempt {attempt + 1}); refetching")
            time.sleep(1 + attempt)
            self.fetch()
            redo()
        raise InfraError(f"could not push {self.branch} after {PUSH_ATTEMPTS} attempts: "
                         f"{pushed.stderr.strip()[-300:]}")


_DATA_README = """# distci-data

The history of distci's scheduled runs, written by the `aggregate` job of
.github/workflows/nightly.yml and the `record` job of bisect.yml. Nothing else writes here.

    runs/<run-id>/results.jsonl   one line per test outcome (the source of truth)
    runs/<run-id>/run.json        cell, tier, runner, image
    runs/<run-id>/stack.json      what the cell resolved to
    runs/<run-id>/junit.xml
    bisect/*.json                 bisect results (read by distci.judge.store.read_bisect)

The SQLite store is an index over these files: `python -m distci ingest runs --bisect-dir bisect`.
"""


def _first_result(run_dir: Path) -> "Result | None":
    results = RunDir(run_dir).results()
    return results[0] if results else None


def run_id_of(run_dir: Path) -> str:
    """The run's id: run.json's, else its first good result's, else the directory's name."""
    info = RunDir(run_dir).read_info()
    if info is not None and info.run_id:
        return info.run_id
    first = _first_result(run_dir)
    return first.run_id if first is not None else run_dir.name


def cell_of(run_dir: Path) -> str:
    """The run's cell id: run.json's, else its first good result's, else empty."""
    info = RunDir(run_dir).read_info()
    if info is not None and info.cell_id:
        return info.cell_id
    first = _first_result(run_dir)
    return first.cell_id if first is not None else ""
