"""The commit axis: a git repository made here, bisected by installing each commit.

The repository holds a pure-Python package (setuptools, src layout). One commit breaks
its pyproject.toml (the build fails: the probe answers skip, the next commit repairs it),
one commit introduces the bug. Each probe exports the commit with `git archive`, builds a
wheel without network, installs it into a cached venv and runs a command read as
`git bisect run` reads it.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distci.bisect import BisectError, BisectState, bisect
from distci.bisect.candidates import SwappedEndpoints, git_candidates
from distci.bisect.nightly_map import (
    NightlyCommit,
    main_commit_of_nightly,
    main_commit_of_release,
    main_range,
    parse_nightly_subject,
)
from distci.bisect.overlay import (
    CommitClass,
    classify_commit,
    classify_file,
    lay_python_over,
    plan_overlays,
)
from distci.bisect.checks import CommandCheck, outcome_from_exit
from distci.bisect.install import CommitBuilder, EnvCache
from distci.bisect.probes import CommitProbe, OverlayProbe
from distci.bisect.report import result_to_dict
from distci.bisect.suspects import rank_suspects, traceback_files
from distci.errors import SourceError

PYPROJECT = """\
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "gdemo"
version = "0.{n}"

[tool.setuptools.packages.find]
where = ["src"]
"""

CHECK = "python -c 'import sys, gdemo; sys.exit(0 if gdemo.scale(3) == 6 else 1)'"


class Repo:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.env = dict(
            os.environ,
            GIT_AUTHOR_NAME="t",
            GIT_AUTHOR_EMAIL="t@example.com",
            GIT_COMMITTER_NAME="t",
            GIT_COMMITTER_EMAIL="t@example.com",
            GIT_CONFIG_GLOBAL=os.devnull,
            GIT_CONFIG_NOSYSTEM="1",
        )
        path.mkdir()
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=self.path, env=self.env, check=True, capture_output=True, text=True
        ).stdout.strip()

    def commit(self, message: str, files: dict[str, str]) -> str:
        for name, text in files.items():
            target = self.path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        self.git("add", "-A")
        self.git("commit", "-q", "-m", message)
        return self.git("rev-parse", "HEAD")


def module(factor_expr: str, extra: str = "") -> dict[str, str]:
    return {"src/gdemo/__init__.py": f"{extra}\ndef scale(x):\n    return {factor_expr}\n"}


@pytest.fixture
def demo_repo(tmp_path) -> tuple[Repo, list[str]]:
    """Eight commits; the 4th (index 3) cannot be built, the 6th (index 5) breaks scale()."""
    repo = Repo(tmp_path / "repo")
    shas = [repo.commit("initial", {"pyproject.toml": PYPROJECT.format(n=0), **module("2 * x")})]
    shas.append(repo.commit("docs", {"README": "gdemo\n"}))
    shas.append(repo.commit("add helper", module("2 * x", "HELP = 1")))
    shas.append(repo.commit("break the build", {"pyproject.toml": "[project\nname = gdemo\n"}))
    shas.append(repo.commit("repair the build", {"pyproject.toml": PYPROJECT.format(n=4)}))
    shas.append(repo.commit("faster scale", module("x << 1 if x % 3 else x + x + 1", "HELP = 1")))
    shas.append(repo.commit("more docs", {"README": "gdemo, scaled\n"}))
    shas.append(repo.commit("tests", {"tests/test_x.py": "def test_x():\n    pass\n"}))
    return repo, shas


@pytest.mark.slow
def test_commit_bisect_installs_each_commit_and_skips_a_broken_build(demo_repo, tmp_path):
    repo, shas = demo_repo
    candidates = git_candidates(repo.path, first=shas[0], last="main")
    assert [c.commit for c in candidates] == shas
    assert candidates[5].subject == "faster scale"

    cache = EnvCache(tmp_path / "cache")
    probe = CommitProbe(CommandCheck(CHECK, cwd=tmp_path, timeout=60), cache,
                        CommitBuilder(cache.root, sys.executable))
    cold = bisect(candidates, probe, state=BisectState.open(tmp_path / "state.json"))
    assert cold.kind == "boundary"
    assert (cold.last_good.commit, cold.first_bad.commit) == (shas[4], shas[5])
    by_commit = {r.key: r for r in cold.probes}
    assert by_commit[shas[3]].outcome == "skip"
    assert "build failed" in by_commit[shas[3]].runs[0].detail
    assert [r.index for r in cold.probes] == [7, 0, 3, 4, 5]

    warm = bisect(candidates, probe)
    assert warm.first_bad == cold.first_bad
    report = result_to_dict(warm)
    assert report["timing"]["warm"]["runs"] == 4
    assert report["timing"]["cold"]["runs"] == 1  # the broken build is tried again
    assert report["probes"][-1]["details"]["subject"] == "faster scale"


def test_commit_list_follows_the_first_parent_chain(tmp_path):
    """A side branch forked before `first` and merged after it is not a chain with the
    mainline: its commits stay out, the merge commit is the candidate."""
    repo = Repo(tmp_path / "repo")
    root = repo.commit("root", {"a": "0"})
    repo.git("checkout", "-q", "-b", "side")
    side = [repo.commit("side 1", {"s": "1"}), repo.commit("side 2", {"s": "2"})]
    repo.git("checkout", "-q", "main")
    good = repo.commit("main 1", {"a": "1"})
    repo.git("merge", "-q", "--no-ff", "-m", "merge side", "side")
    merge = repo.git("rev-parse", "HEAD")
    bad = repo.commit("main 2", {"a": "2"})

    assert [c.commit for c in git_candidates(repo.path, first=good, last=bad)] == [good, merge, bad]
    assert [c.commit for c in git_candidates(repo.path, first=side[0], last=bad)] == [side[0], merge, bad]
    assert [c.commit for c in git_candidates(repo.path, last=bad)] == [root, good, merge, bad]
    assert [c.commit for c in git_candidates(repo.path, last=bad, limit=2)] == [merge, bad]
    with pytest.raises(SwappedEndpoints, match="is an ancestor of"):
        git_candidates(repo.path, first=bad, last=good)
    with pytest.raises(BisectError, match="not an ancestor .*git merge-base"):
        git_candidates(repo.path, first=side[1], last=good)
    with pytest.raises(SourceError, match="'v9' is not a commit"):
        git_candidates(repo.path, first="v9", last=bad)


@pytest.mark.parametrize(
    "code, outcome", [(0, "good"), (1, "bad"), (124, "bad"), (125, "skip"), (126, "bad"), (127, "bad")]
)
def test_exit_codes_read_as_git_bisect_run(code, outcome, tmp_path):
    assert outcome_from_exit(code) == outcome
    assert CommandCheck(f"exit {code}").run(tmp_path)[0] == outcome


def test_exit_code_above_127_aborts(tmp_path):
    with pytest.raises(BisectError, match="exited with 139: codes above 127"):
        CommandCheck("kill -SEGV $$").run(tmp_path)


def test_check_runs_in_the_venv_and_a_timeout_is_its_own_outcome_and_leaves_nothing(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    check = CommandCheck('test "$(command -v python)" = "$VIRTUAL_ENV/bin/python"')
    assert check.run(venv)[0] == "good"
    pid_file = tmp_path / "child.pid"
    hang = CommandCheck(f"sleep 60 & echo $! > {pid_file}; wait", timeout=1)
    outcome, reason, detail = hang.run(venv)
    assert (outcome, reason) == ("skip", "timeout") and detail.startswith("timeout after 1")
    hang.on_timeout = "bad"
    assert hang.run(venv)[:2] == ("bad", "timeout")
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5  # SIGKILL is delivered asynchronously; give it a moment
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a reaper (containers may not reap at once)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- below the nightly: main commits, Python overlays, suspects ------------------------


def test_nightly_git_versions_map_to_main_commits(tmp_path):
    repo = Repo(tmp_path / "pytorch")
    main = [repo.commit(f"main {i}", {"torch/a.py": f"X = {i}\n"}) for i in range(6)]
    repo.git("checkout", "-q", "-b", "release/1.0", main[1])
    repo.commit("cherry-pick a fix", {"torch/b.py": "Y = 1\n"})
    repo.git("tag", "v1.0.0")
    repo.git("checkout", "-q", "--orphan", "nightly")
    first = repo.commit(f"2026-03-01 nightly release ({main[2]})", {"torch/a.py": "X = 2\n"})
    second = repo.commit(f"2026-03-02 nightly release ({main[4][:10]})", {"torch/a.py": "X = 4\n"})
    repo.git("checkout", "-q", "main")

    assert main_commit_of_nightly(repo.path, first) == NightlyCommit(first, dt.date(2026, 3, 1), main[2])
    assert main_range(repo.path, first, second, main="main") == (main[2], main[4])
    assert main_commit_of_release(repo.path, "v1.0.0", main="main") == main[1]
    assert main_range(repo.path, "v1.0.0", second, main="main") == (main[1], main[4])
    assert main_range(repo.path, main[3], "main", main="main") == (main[3], main[5])
    with pytest.raises(BisectError, match="not a nightly release commit"):
        main_commit_of_nightly(repo.path, main[3])
    with pytest.raises(SourceError, match="fetch it first"):
        main_commit_of_nightly(repo.path, "0" * 40)
    assert parse_nightly_subject("2026-11-20 nightly release (abcdef0123)") == (dt.date(2026, 11, 20), "abcdef0123")
    assert parse_nightly_subject('Revert "2026-11-20 nightly release (abcdef0123)"') is None


@pytest.mark.parametrize(
    "path, kind",
    [
        ("torch/distributed/tensor/_api.py", "python"),
        ("torch/_inductor/codegen/triton.py", "python"),
        ("functorch/dim/__init__.py", "python"),
        ("torch/csrc/autograd/init.cpp", "native"),
        ("torch/csrc/distributed/c10d/init.py", "native"),
        ("aten/src/ATen/native/native_functions.yaml", "native"),
        ("torchgen/gen.py", "native"),
        ("tools/autograd/derivatives.yaml", "native"),
        ("torch/_C/__init__.pyi.in", "native"),
        ("torch/version.py", "native"),
        ("setup.py", "native"),
        ("CMakeLists.txt", "native"),
        ("test/distributed/test_c10d.py", "inert"),
        ("docs/source/distributed.rst", "inert"),
        (".github/workflows/pull.yml", "inert"),
        ("README.md", "inert"),
    ],
)
def test_files_are_classified_for_overlays(path, kind):
    assert classify_file(path) == kind


def test_overlay_plan_skips_only_between_native_commits():
    kinds = ["python", "python", "native", "inert", "native", "python", "python"]
    plans = plan_overlays([CommitClass(f"c{i}", k, ()) for i, k in enumerate(kinds)])
    assert [p.binary for p in plans] == ["good", "good", None, None, "bad", "bad", "bad"]
    assert "c2 .. c4" in plans[2].reason
    one = plan_overlays([CommitClass(f"c{i}", k, ()) for i, k in enumerate(["native", "python", "native", "python"])])
    assert [p.binary for p in one] == ["good", "good", "bad", "bad"]


def fake_nightly(repo: Repo, commit: str, venv: Path, kernel: str) -> Path:
    """A 'nightly' of the fake torch: its Python at `commit` plus files only a build makes."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    for path in repo.git("ls-tree", "-r", "--name-only", commit, "torch").splitlines():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(repo.git("show", f"{commit}:{path}") + "\n")
    (site / "torch" / "version.py").write_text(f"git_version = {commit!r}\n")
    (site / "torch" / "_C.so").write_text(kernel)
    return venv


def test_main_commits_bisected_over_nightly_binaries(tmp_path):
    """Fake torch: one native commit between the nightlies (every commit probe-able), the
    culprit a Python commit after it, probed over the bad nightly's binary."""
    repo = Repo(tmp_path / "pytorch")
    init = "from torch._impl import scale\nfrom torch.version import git_version\n"
    shas = [
        repo.commit(
            "good nightly",
            {
                "torch/__init__.py": init,
                "torch/_impl.py": "def scale(x):\n    return 2 * x\n",
                "torch/old.py": "OLD = 1\n",
                "csrc/kernel.cpp": "v0\n",
            },
        )
    ]
    shas.append(repo.commit("python: add util", {"torch/_util.py": "U = 1\n"}))
    shas.append(repo.commit("native: new kernel", {"csrc/kernel.cpp": "v1\n"}))
    shas.append(repo.commit("python: faster scale", {"torch/_impl.py": "def scale(x):\n    return x + x + (x == 3)\n"}))
    shas.append(_delete(repo, "torch/old.py"))
    shas.append(repo.commit("docs", {"docs/index.rst": "torch\n"}))
    good_env = fake_nightly(repo, shas[0], tmp_path / "good", "kernel v0")
    bad_env = fake_nightly(repo, shas[-1], tmp_path / "bad", "kernel v1")

    candidates = git_candidates(repo.path, first=shas[0], last=shas[-1])
    plans = plan_overlays([classify_commit(repo.path, c.commit) for c in candidates])
    assert [p.binary for p in plans] == ["good", "good", "bad", "bad", "bad", "bad"]
    check = CommandCheck("python -c 'import sys, torch; sys.exit(0 if torch.scale(3) == 6 else 1)'")
    probe = OverlayProbe(
        check, EnvCache(tmp_path / "cache"), repo.path, good=(shas[0], good_env), bad=(shas[-1], bad_env), plans=plans
    )
    result = bisect(candidates, probe)
    assert result.kind == "boundary" and result.first_bad.commit == shas[3]
    details = {r.key: r.runs[0].detail for r in result.probes}
    assert details[shas[2]].startswith("bad nightly's binary")

    site = next((tmp_path / "cache" / "envs").glob(f"overlay-bad-{shas[3]}-*/lib/python*/site-packages"))
    assert "x + x" in (site / "torch" / "_impl.py").read_text()
    assert (site / "torch" / "_C.so").read_text() == "kernel v1"
    good_site = next((good_env / "lib").glob("python*/site-packages"))
    overlay = tmp_path / "overlay"
    changed = lay_python_over(repo.path, shas[0], shas[4], good_site, overlay)
    assert changed == ["torch/_impl.py", "torch/_util.py", "torch/old.py"]
    assert not (overlay / "torch" / "old.py").exists()
    assert (overlay / "torch" / "version.py").exists()
    assert "2 * x" in (good_site / "torch" / "_impl.py").read_text()
    assert (good_site / "torch" / "old.py").exists()


def _delete(repo: Repo, path: str) -> str:
    (repo.path / path).unlink()
    return repo.commit(f"python: drop {path}", {})


TRACEBACK = """\
Traceback (most recent call last):
  File "/home/u/proj/tests/test_tp.py", line 10, in test_x
    out = model(x)
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1751, in _call
    return forward_call(*args, **kwargs)
  File "/venv/lib/python3.11/site-packages/torch/distributed/tensor/parallel/style.py", line 200, in _prepare
    return x.redistribute(mesh, placements)
  File "/venv/lib/python3.11/site-packages/torch/distributed/tensor/_api.py", line 300, in redistribute
    raise RuntimeError("boom")
RuntimeError: boom
"""


def test_suspects_ranked_by_files_shared_with_the_traceback():
    assert traceback_files(TRACEBACK) == [
        "torch/nn/modules/module.py",
        "torch/distributed/tensor/parallel/style.py",
        "torch/distributed/tensor/_api.py",
    ]
    assert traceback_files("/src/pytorch/torch/_dynamo/eval_frame.py:400: in _fn\n") == ["torch/_dynamo/eval_frame.py"]
    ranked = rank_suspects(
        [
            ("d", "docs", ["docs/source/x.rst"]),
            ("c", "parallel api", ["torch/distributed/tensor/parallel/api.py"]),
            ("b", "module hooks", ["torch/nn/modules/module.py"]),
            ("a", "redistribute", ["torch/distributed/tensor/_api.py", "test/x.py"]),
        ],
        TRACEBACK,
    )
    assert [s.commit for s in ranked] == ["a", "b", "c", "d"]
    assert ranked[0].shared == ("torch/distributed/tensor/_api.py",)
    assert ranked[2].siblings == ("torch/distributed/tensor/parallel/api.py",)
    assert ranked[3].score == 0
