"""A generated history: N nights x M cells x K tests of run directories, as the harness writes them.

The store, the gate and the dashboard must hold up at the size a team grows into (a
year of nightly history for 50 cells x 300 tests is ~5.5 M results) long before such a
history exists; this writes one, deterministically (a seed), with what real ones hold:

- a matrix.toml whose cells are exactly the generated ones (5 torch x 5 torchao x
  fixes on/off = 50 cells at the default shape), tiers nightly (every cell) and release
  (the torch 2.14.1 fixes-on cells, blocking on `suites`);
- suites tp / float8 / fsdp / regressions, parametrized test ids;
- an upstream break: the float8 tests fail with one signature in the nightly-torch cells
  from 60% of the nights on (torch's git hash changes that night);
- known issues: the first few regression tests fail in fixes-off cells, matched (xfail);
- flaky tests (a few ids flip at random, some passing on their rerun), and now and then
  a night whose environment never came up (one `infra` record, as cellrun writes it);
- on the last night the release cells run the release tier (what a release gate judges:
  the candidate cells' latest complete release run), every other run the nightly tier.

Each results.jsonl line is a full Result record (distci.results) carrying its run's
stack, as the recorder writes it. The stack is the compact one (versions, devices; no
per-fix records), so lines are ~1.3 KB where real ones with the fix list are ~5 KB:
reading is measured on fewer bytes than production would parse (docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Iterator

TORCH = ("2.11.0", "2.12.0", "2.13.0", "2.14.1", "nightly")
TORCHAO = ("0.16.0", "0.17.0", "0.18.0", "0.19.0", "nightly")
SUITES = ("tp", "float8", "fsdp")
RELEASE_TORCH = "2.14.1"
BREAK_SIG = "RuntimeError: Expected type AsyncCollectiveTensor, runtime type Tensor shape: torch.Size([N, N])"
KNOWN_PER_CELL = 5
FLAKY_TESTS = 6
INFRA_RATE = 0.01  # a run whose environment never came up
START = datetime(2025, 12, 1, 2, 0, tzinfo=timezone.utc)


@dataclass(frozen=True)
class Shape:
    """How much history: `nights` x `cells` (at most 50) x `tests` (a multiple of 4 is even)."""

    nights: int
    cells: int = 50
    tests: int = 300
    seed: int = 0

    @property
    def results(self) -> int:
        return self.nights * self.cells * self.tests

    def __post_init__(self) -> None:
        if not 1 <= self.cells <= len(TORCH) * len(TORCHAO) * 2:
            raise ValueError(f"cells={self.cells}: between 1 and {len(TORCH) * len(TORCHAO) * 2}")
        if self.tests < 8 or self.nights < 1:
            raise ValueError(f"tests={self.tests}, nights={self.nights}: at least 8 tests and 1 night")


@dataclass
class History:
    """Where a generated history is: the matrix and the runs root, night by night."""

    root: Path
    matrix: Path
    runs: Path
    shape: Shape
    cells: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)

    def night_groups(self) -> Iterator[Path]:
        """The per-night parent directories, oldest first: what `ingest` is given a night at a time."""
        return iter(sorted(p for p in self.runs.iterdir() if p.is_dir()))


def cell_ids(n: int) -> list[str]:
    """The first `n` cells of the generated matrix (ids as distci.matrix makes them)."""
    ids = [f"cuda-cu130-torch_{t}-ao_{a}-ws2-fix_{f}" for t in TORCH for a in TORCHAO for f in ("on", "off")]
    return ids[:n]


def matrix_text(cells: list[str]) -> str:
    """A matrix.toml declaring exactly `cells` (an exclude per cell left out)."""
    keep = set(cells)
    lines = ["schema = 1", "", "[defaults]", 'python = "3.11"', "world_size = 2", 'suites = ["suites"]',
             "timeout = 300", 'tiers = ["nightly"]', 'fixes = "on"', 'torchtitan = "none"', "",
             "[accelerators.cuda]", 'backend = "nccl"', 'runner = ["gpu-2"]', 'archs = ["x86_64"]',
             'variants = ["cu130"]', "", "[[matrix]]", 'accelerator = "cuda"',
             f"torch = {json.dumps(list(TORCH))}", f"torchao = {json.dumps(list(TORCHAO))}", 'fixes = ["on", "off"]', ""]
    for cell in cell_ids(len(TORCH) * len(TORCHAO) * 2):
        if cell not in keep:
            t, a, f = _axes(cell)
            lines += ["[[exclude]]", f'torch = "{t}"', f'torchao = "{a}"', f'fixes = "{f}"', ""]
    if any(_axes(c)[0] == RELEASE_TORCH and _axes(c)[2] == "on" for c in cells):
        lines += ["[[include]]", f'match = {{ torch = "{RELEASE_TORCH}", fixes = "on" }}', 'tiers = ["release"]', ""]
    lines += ["[tiers.nightly]", 'description = "Every night, every cell; nothing blocks."', "blocking_suites = []", "",
              "[tiers.release]", 'description = "Before a release: a regression blocks."', 'blocking_suites = ["suites"]', ""]
    return "\n".join(lines)


def _axes(cell: str) -> tuple[str, str, str]:
    torch = cell.split("torch_")[1].split("-ao_")[0]
    ao = cell.split("-ao_")[1].split("-ws")[0]
    return torch, ao, cell.rsplit("fix_", 1)[1]


def test_ids(n: int) -> list[str]:
    """`n` test ids over the suites and regressions/, parametrized as the real suites are."""
    per = n // 4
    ids = [f"suites/test_{s}.py::test_{s}_step[{i}-bf16-compile]" for s in SUITES for i in range(per)]
    ids += [f"suites/regressions/test_pytorch1{i:05d}_bug.py::test_bug" for i in range(n - len(ids))]
    return ids


def _stack(cell: str, night: int, day: datetime) -> dict:
    torch, ao, fixes = _axes(cell)
    if torch == "nightly":
        torch = f"2.16.0.dev{day:%Y%m%d}"
    if ao == "nightly":
        ao = f"0.20.0.dev{day:%Y%m%d}"
    return {"torch": torch + "+cu130", "torch_git": hashlib.sha1(f"torch {torch}".encode()).hexdigest(),
            "torchao": ao, "triton": "3.5.0", "python": "3.11.11", "cuda": "13.0", "nccl": "2.28.3",
            "driver": "580.65.06", "device_name": "NVIDIA H200", "device_count": 2, "device_capability": "9.0",
            "arch": "x86_64", "platform": "Linux-6.8.0-x86_64-with-glibc2.39", "distci": "0.1.0",
            "distci_fixes": "0.1.0", "fixes_mode": "all" if fixes == "on" else "none", "image_digest": None,
            "packages": [f"torch=={torch}", f"torchao=={ao}", "numpy==2.3.5", "pytest==9.0.1", "triton==3.5.0"]}


def _outcome(rng: random.Random, cell: str, test: str, k: int, night: int, shape: Shape) -> dict:
    torch, _, fixes = _axes(cell)
    if "test_float8" in test and torch == "nightly" and night >= int(shape.nights * 0.6):
        return {"outcome": "failed", "failure_kind": "exception", "error_signature": BREAK_SIG,
                "message": BREAK_SIG.replace("N", "2048")}
    regression = test.startswith("suites/regressions/")
    index = int(test.split("test_pytorch1")[1][:5]) if regression else -1
    if fixes == "off" and 0 <= index < KNOWN_PER_CELL:
        return {"outcome": "failed", "failure_kind": "exception", "known_issue": f"pytorch1{index:05d}-bug",
                "error_signature": f"RuntimeError: upstream bug {index}", "message": f"RuntimeError: upstream bug {index}"}
    if k < FLAKY_TESTS and rng.random() < 0.15:
        rerun = "passed" if rng.random() < 0.5 else "failed"
        return {"outcome": "failed", "failure_kind": "assert", "reruns": 1, "rerun_outcomes": [rerun],
                "rerun_messages": ["AssertionError: loss differs by 0.02 > 0.001"],
                "error_signature": "AssertionError: loss differs from the single-process reference by N > N",
                "message": "AssertionError: loss differs from the single-process reference by 0.02 > 0.001"}
    return {"outcome": "passed"}


def _line(run_id: str, cell: str, test: str, stack_json: str, started: datetime, run_dir: Path, extra: dict) -> str:
    failed = extra.get("outcome") == "failed"
    record = {
        "run_id": run_id, "cell_id": cell, "test_id": test, "outcome": "passed", "failure_kind": None,
        "error_signature": None, "message": "", "duration_s": 2.5, "reruns": 0, "rerun_outcomes": [],
        "rerun_messages": [], "known_issue": None, "log_path": f"{run_dir}/logs",
        "ranks": [{"rank": r, "outcome": "failed" if failed else "passed",
                   "excerpt": extra.get("message", "") if failed else ""} for r in (0, 1)],
        "repro": f"nox -s dist_tests -- --cell {cell} --test '{test}'",
        "started_at": started.isoformat(), "schema": 1, **extra,
    }
    return json.dumps(record, sort_keys=True)[:-1] + ', "stack": ' + stack_json + "}\n"


def generate(root: Path, shape: Shape) -> History:
    """Writes matrix.toml and runs/n<night>/<run id>/{results.jsonl, run.json, stack.json} under root."""
    root = Path(root)
    history = History(root, root / "matrix.toml", root / "runs", shape, cell_ids(shape.cells), test_ids(shape.tests))
    root.mkdir(parents=True, exist_ok=True)
    history.matrix.write_text(matrix_text(history.cells))
    rng = random.Random(shape.seed)
    for night in range(shape.nights):
        for offset, cell in enumerate(history.cells):
            day = START + timedelta(days=night, minutes=3 * offset)
            write_night(history, night, offset, cell, day, rng)
    return history


def write_night(history: History, night: int, offset: int, cell: str, day: datetime, rng: random.Random) -> Path:
    """One cell's run of one night, as the harness leaves it."""
    run_id = f"{day:%Y%m%dT%H%M%SZ}-{offset:06x}-{cell}"
    run_dir = history.runs / f"n{night:04d}" / run_id
    run_dir.mkdir(parents=True)
    stack = _stack(cell, night, day)
    stack_json = json.dumps(stack, sort_keys=True)
    lines = []
    if rng.random() < INFRA_RATE:
        message = "InfraError: env cuda: pip install failed (exit 1): no matching torch wheel"
        lines.append(_line(run_id, cell, f"<infra>::{cell}", stack_json, day, run_dir,
                           {"outcome": "error", "failure_kind": "infra", "message": message,
                            "error_signature": message, "ranks": []}))
    else:
        for k, test in enumerate(history.tests):
            lines.append(_line(run_id, cell, test, stack_json, day + timedelta(seconds=3 * k), run_dir,
                               _outcome(rng, cell, test, k, night, history.shape)))
    (run_dir / "results.jsonl").write_text("".join(lines))
    (run_dir / "stack.json").write_text(stack_json)
    torch, _, _ = _axes(cell)
    ended = day + timedelta(seconds=3 * len(lines) + 5)
    release = night == history.shape.nights - 1 and torch == RELEASE_TORCH and cell.endswith("fix_on")
    info = {"run_id": run_id, "cell_id": cell, "started_at": day.isoformat(), "ended_at": ended.isoformat(),
            "runner": "gpu-runner-1", "backend": "docker", "tier": "release" if release else "nightly",
            "nightly_date": f"{day:%Y-%m-%d}" if torch == "nightly" else None, "exit_code": 0}
    (run_dir / "run.json").write_text(json.dumps(info, indent=1, sort_keys=True))
    return run_dir
