"""torchtitan's integration tests, run through torchtitan's own integration runner.

torchtitan declares its integration tests as data: `OverrideDefinitions(override_args,
test_descr, test_name, ngpu, disabled)` lists in tests/integration_tests/<group>.py
(`features`, `h100`, `models`), and `python -m tests.integration_tests.run_tests OUT
--test_suite GROUP --test_name NAME --ngpu N` runs one of them by name: it trains the
debug model through `./run_train.sh` (torchrun) once per override-args entry and
raises at the first failure. Two kinds of case come out of that:

- upstream's own (`upstream = ["features", "h100"]`): listed by importing the group
  module in the cell environment (it imports nothing heavy), one Result each,
  `external/torchtitan/integration/<group>::<name>`, with upstream's GPU count; a
  disabled one is skipped with upstream's word for it.
- distci's (`[[suite.case]]`, kind `train`): flavors upstream does not declare at this
  GPU count (TP, async TP, compile, Float8, AC on 2 GPUs), run by upstream's own
  `run_single_test` with an OverrideDefinitions built from the declared args,
  `external/torchtitan/integration::<name>`.

Either way the log is read for the root-cause traceback of the failing rank, and a
passing run must have logged finite losses; `expected_losses` compares them with a
loss file upstream ships (tests/assets/losses/).

Upstream's runner changes between torchtitan's API lines, so `list` also says which line
the checkout speaks, by feature checks on the runner (never by version string):
- 0.2.x: `run_single_test(test_flavor, full_path, output_dir)`, one base_config.toml
  (`--config_path`) plus CLI overrides: every case runs;
- 0.3.x: `run_single_test(test_flavor, output_dir, ...)`, a Python config per flavor
  (`MODULE`/`CONFIG`) and no `--config_path`: upstream's cases run; distci's own cases,
  written as 0.2.x overrides of base_config.toml, are skipped with that reason;
- anything else: every case is skipped with what the check found.

This module is also the in-environment side (`python -m distci.external.adapters.torchtitan
list|train ...`, run with the upstream checkout as working directory): that part uses
the standard library and upstream's own modules only.
"""

from __future__ import annotations

import argparse
import inspect
import json
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

CONFIG = "./tests/integration_tests/base_config.toml"
RUNNER_FAILED = "Integration test failed"  # run_tests.py re-raising a training run's failure
NOTHING_RAN = "No tests were run for --test_name"  # run_tests.py's warning, with exit code 0
LINE_02, LINE_03 = "0.2.x", "0.3.x"
RUNNER_PARAMS = {LINE_02: ("full_path", "output_dir"), LINE_03: ("output_dir",)}
"""run_single_test's parameters after the flavor, per API line."""


# --------------------------------------------------------------------------- in the cell env


def _api_line() -> tuple[str, str]:
    """(API line, "") for upstream's runner in the checkout, or ("", what did not fit)."""
    try:
        from tests.integration_tests.run_tests import run_single_test
    except Exception as err:  # noqa: BLE001 - any failure to import is "not an API we know"
        return "", f"tests.integration_tests.run_tests does not import: {type(err).__name__}: {err}"
    params = tuple(inspect.signature(run_single_test).parameters)
    for line, expected in RUNNER_PARAMS.items():
        if params[1:1 + len(expected)] == expected:
            return line, ""
    known = "; ".join(f"{line}: (flavor, {', '.join(expected)}, ...)" for line, expected in RUNNER_PARAMS.items())
    return "", f"run_single_test{params} matches no runner this adapter knows ({known})"


def _flavor(group: str, flavor: Any) -> dict[str, Any]:
    configs = [f"{fn.__module__}:{fn.__name__}" for fn in getattr(flavor, "configs", ())]
    return {"group": group, "name": flavor.test_name, "descr": flavor.test_descr, "ngpu": flavor.ngpu,
            "disabled": bool(getattr(flavor, "disabled", False)),
            "override_args": [list(a) for a in flavor.override_args], "configs": configs}


def _list(groups: Sequence[str]) -> dict[str, Any]:
    """{"api": line or "", "why": why not, "flavors": [...]}: upstream's declared tests, if the API is known."""
    import importlib

    sys.path.insert(0, str(Path.cwd()))
    line, why = _api_line()
    if not line:
        return {"api": "", "why": why, "flavors": []}
    found = []
    for group in groups:
        module = importlib.import_module(f"tests.integration_tests.{group}")
        builders = [getattr(module, n) for n in dir(module) if n.startswith("build_") and n.endswith("_list")]
        if len(builders) != 1:
            raise RuntimeError(f"tests/integration_tests/{group}.py: expected one build_*_list function, "
                               f"found {len(builders)}")
        found += [_flavor(group, flavor) for flavor in builders[0]()]
    return {"api": line, "why": "", "flavors": found}


def _train(name: str, ngpu: int, out: str, args: Sequence[str], config: str) -> None:
    sys.path.insert(0, str(Path.cwd()))
    from tests.integration_tests import OverrideDefinitions
    from tests.integration_tests.run_tests import run_single_test

    flavor = OverrideDefinitions([list(args)], f"distci: {name}", name, ngpu=ngpu)
    run_single_test(flavor, config, out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distci.external.adapters.torchtitan")
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("list", help="print the runner's API line and upstream's declared integration tests as JSON")
    p.add_argument("groups", nargs="*")
    p = sub.add_parser("train", help="run one flavor through upstream's run_single_test")
    p.add_argument("--name", required=True)
    p.add_argument("--ngpu", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--config", default=CONFIG)
    p.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if ns.what == "list":
        sys.stdout.write("\n" + json.dumps(_list(ns.groups)) + "\n")
        return 0
    _train(ns.name, ns.ngpu, ns.out, [a for a in ns.args if a != "--"], ns.config)
    return 0


# --------------------------------------------------------------------------- controller side


def expand(suite, checkout, where) -> list:
    import subprocess

    from distci.errors import InfraError

    from distci.external.spec import Case

    cases = []
    cmd = [where.python, "-m", "distci.external.adapters.torchtitan", "list", *suite.upstream]
    proc = subprocess.run(cmd, cwd=checkout.path, env=where.environ(suite.env), capture_output=True, text=True,
                          timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise InfraError(f"listing torchtitan's integration tests ({', '.join(suite.upstream) or 'API only'}) failed",
                         log=(proc.stdout + proc.stderr)[-4000:])
    listing = json.loads(lines[-1])
    api = listing["api"]
    unknown = f"torchtitan's integration-test runner is not an API this adapter knows: {listing['why']}"
    if not api:
        for group in suite.upstream:
            cases.append(Case(suite.name, f"external/{suite.name}/integration/{group}", suite.requirements(None),
                              suite.timeout, None, skip=unknown, data={"kind": "upstream", "api": ""}))
    else:
        for item in listing["flavors"]:
            group = item["group"]
            requires = suite.requirements(None, nproc=int(item["ngpu"]), sm=suite.requires_sm_by_group.get(group))
            skip = f"disabled upstream (tests/integration_tests/{group}.py)" if item["disabled"] else ""
            cases.append(Case(suite.name, f"external/{suite.name}/integration/{group}::{item['name']}", requires,
                              suite.timeout, None, skip=skip, data={"kind": "upstream", "api": api, **item}))
    for spec in suite.cases:
        skip = ""
        if not api:
            skip = unknown
        elif api != LINE_02:
            skip = (f"declared as torchtitan {LINE_02} overrides of {CONFIG}; the {api} runner takes a Python "
                    "config per flavor (MODULE/CONFIG)")
        elif spec.expected_losses and checkout.substituted:
            skip = ("upstream's expected losses hold for upstream's own test data; these sources substitute "
                    + ", ".join(sorted(checkout.substituted)))
        cases.append(Case(suite.name, f"external/{suite.name}/integration::{spec.name}", suite.requirements(spec),
                          spec.timeout or suite.timeout, spec, skip=skip, data={"kind": "train", "api": api}))
    return cases


def _command(case, ctx, out: Path) -> list[str]:
    python = ctx.where.python
    if case.data["kind"] == "upstream":
        config = ["--config_path", CONFIG] if case.data.get("api", LINE_02) == LINE_02 else []
        return [python, "-u", "-m", "tests.integration_tests.run_tests", str(out), "--test_suite", case.data["group"],
                "--test_name", case.data["name"], "--ngpu", str(case.requires.nproc), *config]
    return [python, "-u", "-m", "distci.external.adapters.torchtitan", "train", "--name", case.spec.name,
            "--ngpu", str(case.requires.nproc), "--out", str(out), "--", *case.spec.args]


def _tidy(out: Path, passed: bool) -> None:
    """Upstream's outputs: checkpoints go (they are large and re-made on a rerun); compile
    traces stay only for a failure, where they explain it."""
    for path in sorted(out.rglob("checkpoint*"), reverse=True):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
    if passed:
        for path in out.rglob("compile_trace"):
            shutil.rmtree(path, ignore_errors=True)


def run(case, ctx) -> list:
    from distci.external import readers
    from distci.external.launch import launch_command

    out = ctx.out_dir
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(case.spec.env) if case.spec else {}
    launched = launch_command(case.test_id, _command(case, ctx, out), case.timeout, ctx.where, ctx.log_path, env=env)
    combined = readers.command_outcome(launched.returncode, launched.timed_out, launched.log, launched.duration_s,
                                       launched.stuck, wrappers=(RUNNER_FAILED,))
    if combined.outcome == "passed":
        problem = None
        if NOTHING_RAN in launched.log:
            problem = ("NothingRan", f"torchtitan's runner ran no test named {case.data.get('name', '?')}")
        else:
            spec = case.spec
            expected = None
            if spec is not None and spec.expected_losses:
                expected = readers.read_loss_file(ctx.where.cwd / spec.expected_losses)
            problem = readers.check_losses(readers.read_losses(launched.log), expected,
                                           rtol=spec.loss_rtol if spec else 0.0,
                                           min_steps=spec.min_loss_steps if spec else 1)
        if problem:
            combined = readers.failed("assert", problem[0], problem[1], launched.duration_s)
    _tidy(out, combined.outcome == "passed")
    return [(case.test_id, combined)]


if __name__ == "__main__":
    sys.exit(main())
