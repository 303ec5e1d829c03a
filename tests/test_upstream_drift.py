"""Upstream API drift: version-aware fixes, torchtitan adapters chosen by feature checks,
DISTCI_FIXES typos, and the audit's "obsolete since".

torchtitan is not installed in CI, so each torchtitan API line is a small package written
to tmp_path with the shape of the real one (the function signatures and the calls the
checks read, copied from torchtitan 0.2.2 and 0.3.0); the real releases are exercised by
the cells (reports/release-2.15.md) and the fix audit (reports/fix-audit.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "fixes"))

from distci_fixes import Selection, TorchBuild, UnknownFixError  # noqa: E402
from distci_fixes.engine import Engine  # noqa: E402
from distci_fixes.fixes import torchtitan_asynctp_symm_mem as titan_fix  # noqa: E402
from distci.run.cellrun import QUIET_PLUGINS

torch = pytest.importorskip("torch")

TITAN_02_TP = '''
import torch._inductor.config


def maybe_enable_async_tp(job_config, tp_mesh):
    if not job_config.parallelism.enable_async_tensor_parallel:
        return
    torch._inductor.config._micro_pipeline_tp = True
'''
TITAN_03_COMPILE = '''
import warnings
import torch._inductor.config


def _maybe_enable_async_tp(compile_config, tp_mesh):
    if not compile_config.enable_async_tensor_parallel or tp_mesh is None:
        return
    group_name = tp_mesh.get_group().group_name
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        enable_symm_mem_for_group(group_name)
    torch._inductor.config._micro_pipeline_tp = True
'''
TITAN_03_COMPILE_UNFIXED = '''
import torch._inductor.config


def _maybe_enable_async_tp(compile_config, tp_mesh):
    if compile_config.enable_async_tensor_parallel and tp_mesh is not None:
        torch._inductor.config._micro_pipeline_tp = True
'''
TITAN_03_TP = "class NoParallel:\n    pass\n"


@pytest.fixture
def titan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Writes a fake `torchtitan` (files: relative path -> text) and imports it fresh."""

    def make(files: dict[str, str], version: str = "0.3.0") -> types.ModuleType:
        root = tmp_path / f"site-{len(list(tmp_path.iterdir()))}"
        for rel, text in {"torchtitan/__init__.py": f"__version__ = {version!r}\n",
                          "torchtitan/distributed/__init__.py": "", **files}.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(textwrap.dedent(text))
        for name in [m for m in sys.modules if m == "torchtitan" or m.startswith("torchtitan.")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.syspath_prepend(str(root))
        import importlib

        from distci_fixes.patching import restore

        module = importlib.import_module("torchtitan.distributed.tensor_parallel")
        if hasattr(module, titan_fix.FUNCTION):
            restore(module, titan_fix.FUNCTION)  # where distci-fixes is installed, import torch armed the fix
        return module

    yield make
    for name in [m for m in sys.modules if m == "torchtitan" or m.startswith("torchtitan.")]:
        sys.modules.pop(name, None)


def _registry_gate() -> bool:
    return titan_fix._torch_gates_on_registration()


# --- torchtitan_asynctp_symm_mem across torchtitan and torch lines -----------------------


def test_titan_fix_sees_the_bug_in_02(titan) -> None:
    if not _registry_gate():
        pytest.skip("this torch's gate needs no registration: the bug is absent whatever torchtitan does")
    assert titan_fix.detect(titan({"torchtitan/distributed/tensor_parallel.py": TITAN_02_TP}, "0.2.2"))


def test_titan_fix_is_not_needed_where_03_moved_and_fixed_it(titan) -> None:
    module = titan({"torchtitan/distributed/tensor_parallel.py": TITAN_03_TP,
                    "torchtitan/distributed/compile.py": TITAN_03_COMPILE})
    assert titan_fix.detect(module) is False
    assert "torchtitan.distributed.compile" not in sys.modules, "detect() must read the moved module, not import it"
    engine = Engine(fixes=[titan_fix.FIX])
    engine.arm(Selection.parse("all"), TorchBuild.current(), eager=True)
    (record,) = engine.records()
    assert record.status == "not_needed", record


@pytest.mark.parametrize("compile_py", [TITAN_03_COMPILE_UNFIXED, None], ids=["moved_unfixed", "gone"])
def test_titan_fix_is_broken_only_when_the_bug_may_be_there_and_the_target_is_gone(titan, compile_py) -> None:
    if not _registry_gate():
        pytest.skip("this torch's gate needs no registration: not_needed whatever torchtitan does")
    files = {"torchtitan/distributed/tensor_parallel.py": TITAN_03_TP}
    if compile_py:
        files["torchtitan/distributed/compile.py"] = compile_py
    titan(files)
    engine = Engine(fixes=[titan_fix.FIX])
    engine.arm(Selection.parse("all"), TorchBuild.current(), eager=True)
    (record,) = engine.records()
    assert record.status == "broken"
    assert "torchtitan 0.3.0" in record.reason and "maybe_enable_async_tp" in record.reason, record.reason
    assert "this torch" not in record.reason


def test_titan_fix_is_not_needed_under_torch_215s_gate(titan, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.15.0's gate asks for the accelerator's symmetric-memory backend (its shape, verbatim)."""
    import importlib.util

    from torch.distributed import _symmetric_memory as symm_mem

    path = tmp_path / "distci_gate_215.py"
    path.write_text(textwrap.dedent('''
        def is_symm_mem_enabled_for_group(group_name):
            device = torch.accelerator.current_accelerator(check_available=True)
            if device is None or _SymmetricMemory.get_backend(device) is None:
                return False
            return _is_process_group_registered(group_name)
        '''))
    spec = importlib.util.spec_from_file_location("distci_gate_215", path)
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    monkeypatch.setattr(symm_mem, "is_symm_mem_enabled_for_group", gate.is_symm_mem_enabled_for_group)
    assert not titan_fix.detect(titan({"torchtitan/distributed/tensor_parallel.py": TITAN_02_TP}, "0.2.2"))


def test_missing_target_names_its_package() -> None:
    from distci_fixes.patching import TargetMissing, lookup

    with pytest.raises(TargetMissing, match=r"torch\.nn\.no_such_thing does not exist in torch \d"):
        lookup(torch.nn, "no_such_thing")


# --- DISTCI_FIXES typos --------------------------------------------------------------------


def test_unknown_fix_id_is_a_config_error_naming_the_known_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    import distci_fixes

    monkeypatch.setenv("DISTCI_FIXES", "act_tangent_coercion,bogus_fix")
    with pytest.raises(UnknownFixError, match=r"unknown fix id bogus_fix; known ids: act_tangent_coercion, "):
        distci_fixes.check_env()
    with pytest.raises(UnknownFixError, match="rowwise_parallel_wait"):
        distci_fixes.apply("bogus_fix")
    monkeypatch.setenv("DISTCI_FIXES", "none")
    assert distci_fixes.check_env().ids == frozenset()


def test_harness_refuses_an_unknown_fix_id_before_starting_ranks(tmp_path: Path) -> None:
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    env = dict(os.environ, DISTCI_FIXES="bogus_fix",
               PYTHONPATH=os.pathsep.join([str(REPO / "fixes"), str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-q",
                           str(tmp_path / "test_nothing.py")], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "DISTCI_FIXES=bogus_fix: unknown fix id bogus_fix; known ids:" in proc.stderr


# --- the suites' torchtitan adapters --------------------------------------------------------


def test_unknown_torchtitan_api_is_a_skip_reason_from_every_adapter(titan) -> None:
    from suites import titan as lines

    titan({"torchtitan/distributed/tensor_parallel.py": TITAN_03_TP}, "9.9.0")
    with pytest.raises(lines.UnknownAPI) as err:
        lines.select()
    message = str(err.value)
    assert "0.2.x: " in message and "0.3.x: " in message and "torchtitan.config" in message, message


# --- the external adapter's runner check ----------------------------------------------------

RUNNERS = {
    "0.2.x": "def run_single_test(test_flavor, full_path, output_dir):\n    pass\n",
    "0.3.x": "def run_single_test(test_flavor, output_dir, gpu_ids=None):\n    pass\n",
    "": "def run_single_test(flavor, *, where):\n    pass\n",
}


@pytest.mark.parametrize("line", list(RUNNERS), ids=["0.2", "0.3", "unknown"])
def test_external_torchtitan_adapter_tells_the_runner_line(tmp_path: Path, line: str) -> None:
    files = {"tests/__init__.py": "", "tests/integration_tests/__init__.py": "",
             "tests/integration_tests/run_tests.py": RUNNERS[line]}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    proc = subprocess.run([sys.executable, "-m", "distci.external.adapters.torchtitan", "list"], cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    listing = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    assert listing["api"] == line
    assert bool(listing["why"]) == (line == ""), listing


# --- the audit's verdicts -------------------------------------------------------------------


def _rows(*offs: tuple[str, str], package: str = ""):
    from distci.audit.model import AuditRow, TestRun

    return [AuditRow("f", v, "t", None, None, "?", TestRun(off), TestRun("passed" if off != "skipped" else off),
                     package=package) for v, off in offs]


def test_obsolete_since_is_the_first_absent_version_after_a_present_one() -> None:
    from distci.audit.model import judge

    rows = _rows(("2.14.1", "passed"), ("2.5.1", "failed"), ("2.6.0", "skipped"), ("2.7.0", "passed"))
    judge(rows)
    assert {r.torch: r.verdict for r in rows} == {"2.5.1": "needed", "2.6.0": "n/a", "2.7.0": "obsolete since 2.7.0",
                                                  "2.14.1": "obsolete since 2.7.0"}


def test_a_bug_never_seen_is_absent_in_every_audited_version_not_obsolete_since_the_oldest() -> None:
    from distci.audit.model import judge

    rows = _rows(("2.14.1", "passed"), ("2.15.0", "passed"))
    judge(rows)
    assert {r.verdict for r in rows} == {"absent in every audited version"}


def test_package_versions_are_judged_apart() -> None:
    from distci.audit.model import judge

    old = _rows(("2.13.0", "failed"), ("2.15.0", "passed"), package="torchtitan==0.2.2")
    new = _rows(("2.13.0", "passed"), ("2.15.0", "passed"), package="torchtitan==0.3.0")
    judge(old + new)
    assert [r.verdict for r in old] == ["needed", "obsolete since 2.15.0"]
    assert [r.verdict for r in new] == ["absent in every audited version"] * 2
