"""The fix package (fixes/, import distci_fixes) and the fix audit (distci/audit/run.py).

Processes that must see `import torch` load the fixes do so through a real
`torch.backends` entry point: the child's PYTHONPATH carries fixes/ and a dist-info
declaring distci-fixes' entry points (what `pip install fixes/` writes), so these tests
work whether or not distci-fixes is installed in the test environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "fixes"))

from distci_fixes import Applies, Fix, Selection, TorchBuild, decide  # noqa: E402
from distci_fixes.engine import Engine  # noqa: E402
from distci_fixes.fixes import act_tangent_coercion  # noqa: E402

torch = pytest.importorskip("torch")
ACT = act_tangent_coercion.ID


def _dist_info(root: Path, name: str, entry_points: str) -> None:
    info = root / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site dir holding distci-fixes' dist-info, as an install of fixes/ would leave."""
    root = tmp_path_factory.mktemp("site")
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    groups = tomllib.loads((REPO / "fixes" / "pyproject.toml").read_text())["project"]["entry-points"]
    entry_points = "".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in eps.items()) for group, eps in groups.items()
    )
    _dist_info(root, "distci-fixes", entry_points)
    return root


def _child_env(site: Path, fixes: str | None, *extra: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DISTCI_FIXES", "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env["PYTHONPATH"] = os.pathsep.join(map(str, [*extra, site, REPO / "fixes", REPO]))
    if fixes is not None:
        env["DISTCI_FIXES"] = fixes
    return env


PROBE = """
import json, torch
import torch.distributed.tensor.parallel.style as style
import torch.distributed._functional_collectives as funcol
import distci_fixes
from distci_fixes.patching import patched_by
print(json.dumps({
    "rowwise_patched": patched_by(style.RowwiseParallel._prepare_output_fn),
    "funcol_patched": patched_by(funcol._are_we_tracing),
    "report": {r["id"]: r["status"] for r in distci_fixes.report(settle=False)},
}))
"""


_PROBED: dict[tuple[Path, str | None], dict] = {}


def _probe(site: Path, fixes: str | None) -> dict:
    """What a fresh `import torch` did under DISTCI_FIXES=fixes (one child per mode)."""
    if (site, fixes) in _PROBED:
        return _PROBED[site, fixes]
    proc = subprocess.run([sys.executable, "-c", PROBE], env=_child_env(site, fixes), capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _PROBED[site, fixes] = json.loads(proc.stdout.strip().splitlines()[-1])
    return _PROBED[site, fixes]


# --- DISTCI_FIXES, through `import torch` (about 10 s: three child interpreters) ------


def test_import_torch_applies_fixes_through_the_entry_point(site: Path) -> None:
    seen = _probe(site, "all")
    assert seen["rowwise_patched"] == ACT
    assert seen["report"][ACT] == "applied"


def test_distci_fixes_none_applies_nothing(site: Path) -> None:
    seen = _probe(site, "none")
    assert seen["rowwise_patched"] == ""
    assert set(seen["report"].values()) == {"disabled"}


def test_distci_fixes_one_id_applies_only_that_fix(site: Path) -> None:
    seen = _probe(site, ACT)
    assert seen["rowwise_patched"] == ACT
    assert seen["report"][ACT] == "applied"
    assert seen["report"]["float8_asynctp_ac_scale"] == "disabled"


def test_fix_outside_its_range_is_not_applied(site: Path) -> None:
    if TorchBuild.current().release < Version("2.6"):
        pytest.skip("rowwise_parallel_wait is in range below torch 2.6")
    seen = _probe(site, "all")
    assert seen["report"]["rowwise_parallel_wait"] == "out_of_range"
    assert seen["funcol_patched"] == ""


def test_explicit_apply_without_autoload(site: Path) -> None:
    code = ("import torch, distci_fixes, json; print(json.dumps(distci_fixes.apply(['act_tangent_coercion'])))")
    env = _child_env(site, "none")
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    statuses = {r["id"]: r["status"] for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert statuses[ACT] == "applied"


# --- applicability: real version strings through decide() ----------------------------


@pytest.mark.parametrize(
    "version, git, expected",
    [
        ("2.7.0", "", True),
        ("2.7.0+cu126", "", True),
        ("2.8.0", "", False),
        ("2.5.1", "", False),
        ("2.7.0.dev20250101+cu126", "", True),  # between 2.6.0 and 2.7.0, both in range
        ("2.8.0.dev20250301+cu128", "", True),  # boundary: inside the nightly bound
        ("2.8.0.dev20250320+cu128", "", False),  # boundary: after the fix landed
        ("2.9.0.dev20250701", "", False),  # between 2.8.0 and 2.9.0, both out
        ("2.8.0a0+gitabcdef1", "abcdef1234567890", False),  # source build at the fixing commit
        ("2.8.0a0+git1234567", "1234567aaaaaaaaa", None),  # source build on the boundary: detect()
        ("2.7.0a0+git1234567", "", True),  # source build between 2.6 and 2.7: both in range
    ],
)
def test_range_decision(version: str, git: str, expected: bool | None) -> None:
    applies = Applies(releases=">=2.6,<2.8", nightly_until="2025-03-15", fixed_commits=("abcdef1",))
    assert decide(applies, TorchBuild(version, git)).in_range is expected


def test_dev_build_inside_nightly_bound_is_applied_by_the_engine() -> None:
    """A nightly the release specifier cannot place is applied when its date is in bounds."""
    target = types.ModuleType("distci_test_nightly_target")
    target.buggy = lambda: "bug"  # type: ignore[attr-defined]
    sys.modules[target.__name__] = target

    def detect(module: types.ModuleType) -> bool:
        return module.buggy() == "bug"

    def apply(module: types.ModuleType) -> None:
        module.buggy = lambda: "fixed"

    fix = Fix(id="nightly_case", title="t", upstream=(), target=target.__name__, detect=detect, apply=apply,
              test="-", applies=Applies(releases="<2.12", nightly_from="2026-01-10", nightly_until="2026-03-10"))
    engine = Engine(fixes=[fix])
    engine.arm(Selection.parse("all"), TorchBuild("2.12.0.dev20260301+cu130", "0" * 40), eager=True)
    (record,) = engine.records()
    assert (record.status, record.in_range, target.buggy()) == ("applied", True, "fixed")

    engine = Engine(fixes=[fix])
    engine.arm(Selection.parse("all"), TorchBuild("2.12.0.dev20260315+cu130", ""), eager=True)
    assert engine.records()[0].status == "out_of_range"


def test_selection_parsing() -> None:
    assert Selection.parse(None).allows("x") and Selection.parse("all").allows("x")
    assert not Selection.parse("none").allows("x")
    both = Selection.parse(" a , b ")
    assert both.allows("a") and both.allows("b") and not both.allows("c")


# --- broken targets --------------------------------------------------------------------


def test_vanished_patch_target_is_recorded_broken_not_raised() -> None:
    """The real act_tangent fix against a style module whose RowwiseParallel lost the method."""
    style = types.ModuleType("distci_test_vanished_style")

    class RowwiseParallel:  # upstream renamed _prepare_output_fn
        pass

    style.RowwiseParallel = RowwiseParallel  # type: ignore[attr-defined]
    sys.modules[style.__name__] = style
    gone_module = replace(act_tangent_coercion.FIX, id="act_missing_module", target="torch.distci_no_such_module")
    absent_package = replace(act_tangent_coercion.FIX, id="act_absent_package", target="distci_no_such_package.mod")
    engine = Engine(fixes=[replace(act_tangent_coercion.FIX, target=style.__name__), gone_module, absent_package])
    engine.arm(Selection.parse("all"), TorchBuild("2.13.0"), eager=True)
    records = {r.id: r for r in engine.records()}
    assert records[ACT].status == "broken"
    assert "RowwiseParallel._prepare_output_fn does not exist" in records[ACT].reason
    assert records["act_missing_module"].status == "broken"
    # a fix for a package the stack does not have (torchtitan in a torch-only cell) has nothing to do
    assert records["act_absent_package"].status == "not_needed"
    assert "distci_no_such_package is not installed" in records["act_absent_package"].reason


def test_apply_is_idempotent() -> None:
    import torch.distributed.tensor.parallel.style as style

    from distci_fixes.patching import patched_by, restore

    was_patched = patched_by(style.RowwiseParallel.__dict__["_prepare_output_fn"]) == ACT
    restore(style.RowwiseParallel, "_prepare_output_fn")  # autoload may have applied it here
    assert act_tangent_coercion.detect(style)
    try:
        act_tangent_coercion.apply(style)
        once = style.RowwiseParallel.__dict__["_prepare_output_fn"]
        act_tangent_coercion.apply(style)
        assert style.RowwiseParallel.__dict__["_prepare_output_fn"] is once
        assert patched_by(once) == ACT and not act_tangent_coercion.detect(style)
    finally:
        restore(style.RowwiseParallel, "_prepare_output_fn")
        if was_patched:
            act_tangent_coercion.apply(style)


# --- a second fix package, and the audit -----------------------------------------------

TEAM_FIX = '''
from distci_fixes import Applies, Fix

def detect(module):
    return module.answer() != 42

def apply(module):
    module.answer = lambda: 42

FIX = Fix(id="team_answer", title="the team's own patch", upstream=("https://example.invalid/1",),
          applies=Applies(releases=">=2.0"), target="team_target", detect=detect, apply=apply,
          test=__file__.replace("team_fixes.py", "test_team_answer.py"), origin="team-fixes")
'''


@pytest.fixture
def team_site(tmp_path: Path) -> Path:
    (tmp_path / "team_target.py").write_text("def answer():\n    return 41\n")
    (tmp_path / "team_fixes.py").write_text(TEAM_FIX)
    (tmp_path / "test_team_answer.py").write_text(
        "def test_answer():\n    import torch, team_target\n    assert team_target.answer() == 42\n")
    _dist_info(tmp_path, "team-fixes", "[distci.fixes]\nteam_answer = team_fixes:FIX\n")
    return tmp_path


def test_second_package_fix_is_applied_through_its_entry_point(site: Path, team_site: Path) -> None:
    code = ("import json, torch, team_target, distci_fixes; "
            "print(json.dumps([team_target.answer(), distci_fixes.report(settle=False)]))")
    proc = subprocess.run([sys.executable, "-c", code], env=_child_env(site, None, team_site),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    answer, report = json.loads(proc.stdout.strip().splitlines()[-1])
    team = next(r for r in report if r["id"] == "team_answer")
    assert (answer, team["status"], team["origin"]) == (42, "applied", "team-fixes")


@pytest.mark.slow
def test_second_package_fix_is_audited(site: Path, team_site: Path, tmp_path: Path) -> None:
    from distci.audit import run as audit

    env = {"PYTHONPATH": _child_env(site, None, team_site)["PYTHONPATH"]}
    result = audit.run_audit([], None, tmp_path / "audit", only={"team_answer"}, extra_env=env,
                             timeout=600, python=Path(sys.executable), log=lambda *_: None)
    (row,) = result.rows
    assert (row.present, row.status, row.off.outcome, row.on.outcome, row.verdict) == (
        True, "applied", "failed", "passed", "needed")
    assert "team_answer" in (tmp_path / "audit" / "latest" / "audit.md").read_text()


# --- a fix for a third-party package (torchtitan is not installed in CI) ---------------

TORCHTITAN_022_TENSOR_PARALLEL = '''
import torch
import torch._inductor.config


def maybe_enable_async_tp(job_config, tp_mesh):
    if not job_config.parallelism.enable_async_tensor_parallel:
        return
    if not (job_config.compile.enable and "model" in job_config.compile.components):
        raise RuntimeError("Async TP requires 'model' in --compile.components and --compile.enable")
    torch._inductor.config._micro_pipeline_tp = True
'''


def test_torchtitan_asynctp_fix_registers_the_tp_group(tmp_path: Path) -> None:
    """The fix against a module with torchtitan 0.2.2's maybe_enable_async_tp, verbatim in
    behaviour; suites/regressions/test_torchtitan3869_asynctp_symm_mem.py runs the real one."""
    import importlib.util

    import torch._inductor.config as inductor_config
    import torch.distributed as dist
    from torch.distributed import _symmetric_memory as symm_mem

    from distci_fixes.fixes import torchtitan_asynctp_symm_mem as fix

    path = tmp_path / "distci_titan_tp.py"
    path.write_text(TORCHTITAN_022_TENSOR_PARALLEL)
    spec = importlib.util.spec_from_file_location("distci_titan_tp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert fix.detect(module), "the bug should be detected in torchtitan 0.2.2's function"

    job = types.SimpleNamespace(parallelism=types.SimpleNamespace(enable_async_tensor_parallel=True),
                                compile=types.SimpleNamespace(enable=True, components=["model"]))
    previous = inductor_config._micro_pipeline_tp
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD.group_name
    mesh = types.SimpleNamespace(get_group=lambda: dist.group.WORLD)
    try:
        module.maybe_enable_async_tp(job, mesh)
        assert not symm_mem.is_symm_mem_enabled_for_group(group), "unpatched, the group stays unregistered"
        fix.apply(module)
        fix.apply(module)  # idempotent
        assert not fix.detect(module)
        job.parallelism.enable_async_tensor_parallel = False
        module.maybe_enable_async_tp(job, mesh)
        assert not symm_mem.is_symm_mem_enabled_for_group(group), "a job without async TP must not register"
        job.parallelism.enable_async_tensor_parallel = True
        module.maybe_enable_async_tp(job, tp_mesh=mesh)  # by keyword, as a caller may
        assert symm_mem.is_symm_mem_enabled_for_group(group)
        assert inductor_config._micro_pipeline_tp is True
    finally:
        getattr(symm_mem, "_group_name_to_store", {}).pop(group, None)
        inductor_config._micro_pipeline_tp = previous
        dist.destroy_process_group()
