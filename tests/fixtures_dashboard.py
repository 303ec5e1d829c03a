"""A generated store the size the dashboard must handle: 120 tests x 10 cells x 14 nights.

What it holds, so tests can assert each on the page:

- one upstream break: the 40 float8 tests fail with one signature in the three torch
  nightly cells that ran, from night 12 on (torch's git hash changed that night);
- a release cell with one regression after a triton update (the release tier is BLOCKED);
- a stale cell (last run 5.5 days before `NOW`), a missing cell (declared, never ran),
  an infra-only cell (its last environment never came up), an in-flight run;
- a fixes-off twin whose five failures are known issues (xfail) that the fix package
  hides in its fixes-on cell.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from fixtures_runs import write_run

from distci.matrix import load_matrix

MATRIX = """\
schema = 1

[defaults]
python = "3.11"
world_size = 2
suites = ["suites"]
timeout = 300
tiers = ["nightly"]
fixes = "on"
torchao = "0.18.0"
torchtitan = "none"

[accelerators.cpu]
backend = "gloo"
runner = ["ubuntu-latest"]
archs = ["x86_64"]
variants = ["cpu"]

[accelerators.cuda]
backend = "nccl"
runner = ["gpu-2"]
archs = ["x86_64"]
variants = ["cu130"]

[[matrix]]
accelerator = "cpu"
torch = ["2.14.1", "nightly"]
fixes = ["on", "off"]

[[matrix]]
accelerator = "cuda"
torch = ["2.13.0", "2.14.1", "nightly"]
fixes = ["on", "off"]

[[include]]
match = { torch = "2.14.1", fixes = "on" }
tiers = ["release"]

[[include]]
match = { accelerator = "cuda", torch = "2.13.0", fixes = "on" }
tiers = ["release"]

[[include]]
match = { accelerator = "cpu", torch = "2.14.1", fixes = "on" }
tiers = ["pr"]

[tiers.pr]
description = "Every pull request: the CPU release cell."
blocking_suites = ["suites"]

[tiers.nightly]
description = "Every night, every cell; nothing blocks."
blocking_suites = []

[tiers.release]
description = "Before a release: released stacks; a regression blocks."
blocking_suites = ["suites"]
"""

NIGHTS = 14
FIRST_BAD_NIGHT = 11  # index: the 12th night
NOW = datetime(2026, 11, 30, 14, 0, tzinfo=timezone.utc)
START = datetime(2026, 11, 17, 2, 0, tzinfo=timezone.utc)
TP = [f"suites/test_tp.py::test_tp_loss[{i}]" for i in range(40)]
F8 = [f"suites/test_float8.py::test_float8_grads[{i}]" for i in range(40)]
REG = [f"suites/regressions/test_pytorch1000{i:02d}_bug.py::test_bug" for i in range(40)]
TESTS = TP + F8 + REG
BREAK_SIG = "RuntimeError: Expected type AsyncCollectiveTensor, runtime type Tensor shape: torch.Size([N, N])"
RELEASE_SIG = "AssertionError: loss differs from the single-process reference by N > N"
HIDDEN = REG[:5]
HIDDEN_KNOWN = [f"pytorch1000{i:02d}-bug" for i in range(5)]
HIDDEN_FIXES = [f"fix_bug_{i}" for i in range(5)]
ISSUE_URL = "https://github.com/example/distci/issues/42"
CI = {"server": "https://github.com", "repository": "example/distci", "run_id": "987654", "attempt": "2",
      "job": "cell"}
HOSTILE_CI = dict(CI, server="javascript:alert(document.domain)//")  # a run.json nobody should trust
UPSTREAM = {k: f"https://github.com/pytorch/pytorch/issues/1000{i:02d}" for i, k in enumerate(HIDDEN_KNOWN)}
UPSTREAM[HIDDEN_KNOWN[4]] = "javascript:alert(1)"  # never a link


@dataclass
class Generated:
    root: Path
    matrix: Path
    cells: dict[str, str] = field(default_factory=dict)  # role -> cell id

    @property
    def issues(self) -> dict[str, str]:
        return {BREAK_SIG: ISSUE_URL}

    @property
    def known_issues(self) -> Path:
        """The known-issues registry of the hidden failures (their upstream links)."""
        return self.root.parent / "known_issues.toml"


def _cells(matrix_path: Path) -> dict[str, str]:
    ids = [c.id for c in load_matrix(matrix_path).select()]

    def one(*parts: str) -> str:
        (found,) = [i for i in ids if all(p in i for p in parts)]
        return found

    return {
        "twin_on": one("cpu-", "torch_2.14.1", "fix_on"),
        "twin_off": one("cpu-", "torch_2.14.1", "fix_off"),
        "break_cpu": one("cpu-", "torch_nightly", "fix_on"),
        "missing": one("cpu-", "torch_nightly", "fix_off"),
        "stale": one("cuda-", "torch_2.13.0", "fix_on"),
        "infra": one("cuda-", "torch_2.13.0", "fix_off"),
        "release_red": one("cuda-", "torch_2.14.1", "fix_on"),
        "in_flight": one("cuda-", "torch_2.14.1", "fix_off"),
        "break_on": one("cuda-", "torch_nightly", "fix_on"),
        "break_off": one("cuda-", "torch_nightly", "fix_off"),
    }


def _stack(cell: str, night: str, *, triton: str = "3.5.0") -> dict:
    nightly = "torch_nightly" in cell
    torch = (f"2.16.0.dev{night.replace('-', '')}" if nightly else cell.split("torch_")[1].split("-")[0])
    git = hashlib.sha1(f"torch {torch}".encode()).hexdigest()
    fixes_on = cell.endswith("fix_on")
    return {
        "torch": torch + ("+cpu" if cell.startswith("cpu") else "+cu130"),
        "torch_git": git,
        "torchao": "0.18.0",
        "triton": triton,
        "python": "3.11.11",
        "cuda": None if cell.startswith("cpu") else "13.0",
        "device_name": "cpu" if cell.startswith("cpu") else "NVIDIA H200",
        "fixes_mode": "all" if fixes_on else "none",
        "fixes": [{"id": f, "status": "applied" if fixes_on else "disabled"} for f in HIDDEN_FIXES],
        "image_digest": None,
    }


def _rows(role: str, n: int) -> list[dict]:
    rows = []
    for t in TESTS:
        row: dict = {"test_id": t, "duration_s": 2.0}
        if role.startswith("break") and t in F8 and n >= FIRST_BAD_NIGHT:
            row.update(outcome="failed", failure_kind="exception", error_signature=BREAK_SIG,
                       message=BREAK_SIG.replace("N", "2048"))
        if role == "twin_off" and t in HIDDEN:
            k = HIDDEN.index(t)
            row.update(outcome="failed", failure_kind="exception", known_issue=HIDDEN_KNOWN[k],
                       error_signature=f"RuntimeError: upstream bug {k}", message=f"RuntimeError: upstream bug {k}")
        if role == "release_red" and t == TP[7] and n == NIGHTS - 1:
            row.update(outcome="failed", failure_kind="assert", error_signature=RELEASE_SIG,
                       message="AssertionError: loss differs from the single-process reference by 0.3 > 0.001")
        rows.append(row)
    return rows


def generate(root: Path) -> Generated:
    """Writes the matrix and every run directory under root; returns where they are."""
    root.mkdir(parents=True, exist_ok=True)
    matrix = root / "matrix.toml"
    matrix.write_text(MATRIX)
    gen = Generated(root / "runs", matrix, _cells(matrix))
    gen.known_issues.write_text("".join(
        f'[[issue]]\nid = "{k}"\ntests = ["{HIDDEN[i]}"]\nsignature = "upstream bug {i}"\nupstream = "{UPSTREAM[k]}"\n\n'
        for i, k in enumerate(HIDDEN_KNOWN)))
    for offset, (role, cell) in enumerate(gen.cells.items()):
        if role == "missing":
            continue
        for n in range(NIGHTS):
            if role == "stale" and n > 8:
                break
            night = (START + timedelta(days=n)).date().isoformat()
            rows = _rows(role, n)
            last = n == NIGHTS - 1
            if role == "infra" and last:
                rows = [{"test_id": f"<infra>::{cell}", "outcome": "error", "failure_kind": "infra",
                         "message": "InfraError: env cuda: pip install failed (exit 1): no matching torch wheel"}]
            if role == "in_flight" and last:
                rows = rows[:60]
            run_id = f"{night.replace('-', '')}T020000Z-{offset:02d}-{cell}"
            run_dir = write_run(gen.root, run_id, cell, rows, started_at=START + timedelta(days=n, minutes=7 * offset),
                                stack=_stack(cell, night, triton="3.5.1" if role == "release_red" and last else "3.5.0"),
                                tier="nightly",
                                nightly_date=night if "torch_nightly" in cell else None,
                                runner="gpu-runner-1" if cell.startswith("cuda") else "ubuntu-2c",
                                backend="docker" if cell.startswith("cuda") else "venv", durable=False)
            info = json.loads((run_dir / "run.json").read_text())
            info["ci"] = HOSTILE_CI if role == "stale" else CI
            if role == "in_flight" and last:
                info["ended_at"] = ""
            (run_dir / "run.json").write_text(json.dumps(info, indent=1))
            (run_dir / "pytest.log").write_text("pytest output\n")
            (run_dir / "logs").mkdir(exist_ok=True)
            (run_dir / "logs" / "rank0.log").write_text("rank 0\n")
    return gen
