"""torchao's distributed tests: test/float8 scripts run with torchrun, and pytest files.

torchao's multi-GPU Float8 tests (test_dtensor.py, test_fsdp2_tp.py) are scripts: a
`setup_distributed()` that builds the mesh, test functions taking the mesh, and a
`tests = [...]` list that `__main__` runs in order, stopping at the first failure.
distci runs each listed function in its own torchrun launch instead, so every function
is its own Result and a crash in one does not hide the others. Functions are found in
that list (read from the source, never by running it), unless the case names them.

A function that prints `skipping <its name> ...` and returns (torchao's way of
disabling a test on some torch versions) is recorded as skipped with that line.

Other test files (test/float8/test_fsdp2/test_fsdp2.py) are pytest files whose tests
spawn their own processes: one pytest launch, one Result per JUnit testcase.
"""

from __future__ import annotations

import ast
import re

from distci.harness.outcome import Combined

from distci.external import readers
from distci.external.fetch import Checkout
from distci.external.launch import CaseContext, launch_command, launch_ranks
from distci.external.spec import Case, CaseSpec, SuiteSpec

DEFAULT_SETUP = "setup_distributed"


def main_list(source: str) -> list[str]:
    """The names in the `tests = [...]` list of a script's `if __name__ == "__main__":` block."""
    tree = ast.parse(source)
    for node in tree.body:
        if not (isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)):
            continue
        for stmt in ast.walk(node):
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.List, ast.Tuple)):
                names = [e.id for e in stmt.value.elts if isinstance(e, ast.Name)]
                if names and len(names) == len(stmt.value.elts):
                    return names
    return []


def _defines(source: str, name: str) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in ast.parse(source).body)


def _suffix(spec: CaseSpec) -> str:
    return f"[{spec.variant}]" if spec.variant else ""


def expand(suite: SuiteSpec, checkout: Checkout, where: object = None) -> list[Case]:
    cases: list[Case] = []
    for spec in suite.cases:
        path = checkout.path / spec.script
        timeout = spec.timeout or suite.timeout
        requires = suite.requirements(spec)
        base = f"external/{suite.name}/{spec.script}"
        if not path.is_file():
            cases.append(Case(suite.name, base + _suffix(spec), requires, timeout, spec,
                              skip=f"{spec.script} is not in the upstream sources at this version"))
            continue
        if spec.kind == "functions":
            source = path.read_text(encoding="utf-8")
            functions = list(spec.functions) or main_list(source)
            setup = spec.setup if spec.setup is not None else (DEFAULT_SETUP if _defines(source, DEFAULT_SETUP) else "")
            for fn in functions:
                if fn in spec.exclude:
                    continue
                cases.append(Case(suite.name, f"{base}::{fn}{_suffix(spec)}", requires, timeout, spec,
                                  data={"function": fn, "setup": setup or None}))
        else:
            cases.append(Case(suite.name, base + _suffix(spec), requires, timeout, spec))
    return cases


def _skip_line(log: str, function: str) -> str | None:
    m = re.search(rf"^skipping {re.escape(function)}\b.*$", log, re.MULTILINE)
    return m.group(0).strip() if m else None


def run(case: Case, ctx: CaseContext) -> list[tuple[str, Combined]]:
    spec = case.spec
    assert spec is not None
    env = dict(spec.env)
    if spec.kind == "functions":
        fn = case.data["function"]
        combined, text = launch_ranks(case.test_id, "run_function",
                                      {"script": spec.script, "function": fn, "setup": case.data.get("setup")},
                                      case.requires.nproc, case.timeout, ctx.where, ctx.log_path, env=env)
        if combined.outcome == "passed":
            logs = "\n".join(readers.split_ranks(text).values()) or text
            line = _skip_line(logs, fn)
            if line:
                return [(case.test_id, readers.skipped(f"upstream: {line}", combined.duration_s))]
        return [(case.test_id, combined)]
    return _run_pytest(case, ctx, env)


def _run_pytest(case: Case, ctx: CaseContext, env: dict[str, str]) -> list[tuple[str, Combined]]:
    spec = case.spec
    assert spec is not None
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    junit = ctx.out_dir / "junit.xml"
    junit.unlink(missing_ok=True)
    target = spec.script + case.data.get("node", "")
    # --rootdir pins JUnit classnames to the checkout-relative path, which the test ids reuse.
    cmd = [ctx.where.python, "-u", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", "--rootdir", ".",
           f"--junitxml={junit}", "-o", "junit_family=xunit1", *spec.args, target]
    launched = launch_command(case.test_id, cmd, case.timeout, ctx.where, ctx.log_path, env=env)
    if not junit.exists() or launched.timed_out:
        return [(case.test_id, readers.command_outcome(launched.returncode, launched.timed_out, launched.log,
                                                       launched.duration_s, launched.stuck))]
    module = spec.script.removesuffix(".py").replace("/", ".")
    results = []
    for tc in readers.read_junit(junit):
        cls = "" if tc.classname == module else tc.classname.removeprefix(module + ".")
        test_id = "::".join(p for p in (f"external/{case.suite}/{spec.script}", cls, tc.name) if p)
        results.append((test_id, readers.junit_outcome(tc)))
    if not results:
        return [(case.test_id, readers.command_outcome(launched.returncode or 1, False, launched.log,
                                                       launched.duration_s, []))]
    return results


def narrow(case: Case, pattern: str) -> Case | None:
    """A pytest-file case narrowed to the testcase a selection names (`...file.py::Class::test`)."""
    if case.spec is None or case.spec.kind != "pytest" or not pattern.startswith(case.test_id + "::"):
        return None
    from dataclasses import replace

    return replace(case, data={**case.data, "node": pattern[len(case.test_id):]})

