"""Delta debugging between two builds: the differing Python files, then hunks.

Two fake torch builds (venvs holding a `torch` package) differ in four files and, inside
the culprit file, in three hunks; only one hunk flips the check, and one file only
imports when another changed file comes with it (an overlay broken by a half-applied
change must not be blamed).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from distci.bisect.checks import CommandCheck
from distci.bisect.install import EnvCache
from distci.bisect.hunks import apply_hunks, hunks_of
from distci.bisect.pydiff import ddmin, python_diff

CHECK = "python -c 'import sys, torch; sys.exit(0 if torch.ops.scale(3) == 6 else 1)'"
OPS = "import math\n\n\ndef scale(x):\n    return {scale}\n\n\ndef name():\n    return {name!r}\n\n\nPI = {pi}\n"


def build(root: Path, files: dict[str, str]) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python*/site-packages"))
    for path, text in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    return root


def test_the_smallest_change_is_named_file_then_hunk(tmp_path):
    init = "from torch import ops, util\n"
    good = build(tmp_path / "good", {
        "torch/__init__.py": init, "torch/ops.py": OPS.format(scale="2 * x", name="a", pi="3.14"),
        "torch/util.py": "U = 1\n", "torch/extra.py": "E = 1\n", "torch/version.py": "git_version = 'g'\n",
        "torch/_C.so": "native"})
    bad = build(tmp_path / "bad", {
        "torch/__init__.py": init + "from torch import extra\n",
        "torch/ops.py": OPS.format(scale="x + x + (x == 3)", name="b", pi="math.pi"),
        "torch/util.py": "from torch.extra import E2\nU = E2\n", "torch/extra.py": "E = 1\nE2 = 2\n",
        "torch/version.py": "git_version = 'b'\n", "torch/_C.so": "native"})
    lines = []
    result = python_diff(CommandCheck(CHECK), EnvCache(tmp_path / "cache"), good, bad, log=lines.append)
    assert result.files == ["torch/ops.py"]
    assert [h.key for h in result.hunks] == ["torch/ops.py:5"]
    assert "+    return x + x + (x == 3)" in result.hunks[0].unified()
    assert result.hunks[0].search_terms() == ["return x + x + (x == 3)", "return 2 * x"]
    assert result.differing_files == 4  # version.py and native files are not candidates
    assert result.probes <= 12
    assert "python diff: 4 files changed, 0 added, 0 removed" in lines


def test_ddmin_finds_a_pair_that_only_fails_together():
    calls = []

    def fails(subset):
        calls.append(list(subset))
        return {3, 11} <= set(subset)

    assert sorted(ddmin(list(range(16)), fails)) == [3, 11]
    assert len(calls) <= 64  # far from the 2**16 subsets; PythonDiff memoizes repeats


def test_hunks_apply_alone_or_together(tmp_path):
    (tmp_path / "a.py").write_text("a\nb\nc\nd\ne\n")
    (tmp_path / "b.py").write_text("a\nB\nc\nd\nE\nf\n")
    hunks = hunks_of("x.py", tmp_path / "a.py", tmp_path / "b.py")
    assert len(hunks) == 2
    good = (tmp_path / "a.py").read_text()
    assert apply_hunks(good, hunks) == (tmp_path / "b.py").read_text()
    assert apply_hunks(good, hunks[1:]) == "a\nb\nc\nd\nE\nf\n"
