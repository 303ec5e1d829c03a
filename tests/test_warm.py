"""The rank template's imports ahead and the guard that keeps it forkable (distci.harness.warm).

No GPU here: a stand-in "initialized" probe (a flag a module sets when it is imported)
plays the part of torch.cuda.is_initialized(); the lead runs the CUDA case on a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import CASES, REPO, run_pytest
from distci.harness.devices import DEVICES
from distci.harness.warm import BEFORE_ANY, JOINING, RECORD_ENV, import_ahead, newly_imported, remember, remembered


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A package of modules: `good_a`, `good_b`, `starts_device` (sets the probe's flag on
    import, as a module that calls torch.cuda at import time would), `broken` (raises)."""
    pkg = tmp_path / "warmcase"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "probe.py").write_text("INITIALIZED = False\nBAD_FORK = False\n")
    # starts the runtime without a lazy init, as torch.cuda.is_available() does: only forks see it
    (pkg / "starts_driver.py").write_text("import os\nfrom warmcase import probe\n"
                                          "os.register_at_fork(after_in_child=lambda: setattr(probe, 'BAD_FORK', True))\n")
    (pkg / "good_a.py").write_text("")
    (pkg / "good_b.py").write_text("")
    (pkg / "starts_device.py").write_text("from warmcase import probe\nprobe.INITIALIZED = True\n")
    (pkg / "broken.py").write_text("raise ImportError('no such thing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m == "warmcase" or m.startswith("warmcase.")]:
        del sys.modules[name]


def _initialized() -> bool:
    from warmcase import probe

    return probe.INITIALIZED


def test_the_import_that_initializes_the_device_stops_the_warming(modules):
    warmed = import_ahead(["warmcase.good_a", "warmcase.broken", "warmcase.starts_device", "warmcase.good_b"],
                          _initialized)
    assert warmed.poisoned == "warmcase.starts_device"
    assert warmed.imported == ["warmcase.good_a"]
    assert "ImportError" in warmed.failed["warmcase.broken"]
    assert "warmcase.good_b" not in sys.modules, "nothing may be imported after the device was initialized"


def test_a_replaced_template_skips_what_poisoned_its_predecessor(modules):
    warmed = import_ahead(["warmcase.good_a", "warmcase.starts_device", "warmcase.good_b"], _initialized,
                          skip=["warmcase.starts_device"])
    assert warmed.poisoned is None
    assert warmed.imported == ["warmcase.good_a", "warmcase.good_b"]
    assert not _initialized()


def test_a_template_initialized_before_any_import_is_never_warmed(modules):
    import warmcase.starts_device  # noqa: F401

    warmed = import_ahead(["warmcase.good_a"], _initialized)
    assert warmed.poisoned == BEFORE_ANY and warmed.imported == []


def test_only_library_modules_are_learned_from_a_test(modules):
    before = frozenset(sys.modules)
    import warmcase.good_a  # noqa: F401 - a test's own helper: may change its process on import

    import torch.utils.checkpoint  # noqa: F401 - may already be imported: then it is not new
    learned = newly_imported(before)
    assert not [m for m in learned if m.startswith("warmcase")]
    assert all(m.split(".")[0] in ("torch", "triton") and not m.startswith("torch.testing") for m in learned)


def test_the_cpu_and_an_untouched_cuda_are_not_initialized():
    import torch  # noqa: F401 - the probe looks only where torch is imported

    assert DEVICES["cpu"].initialized() is False
    assert DEVICES["cuda"].initialized() is False  # no CUDA call was made in this process
    assert DEVICES["npu"].initialized() is False  # torch_npu not imported: it cannot have started


WORKER_SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from distci.harness import worker
    from distci.harness.devices import DeviceKind

    class StandIn(DeviceKind):  # a device whose runtime starts when warmcase.starts_device is imported
        def initialized(self):
            return bool(getattr(sys.modules.get("warmcase.probe"), "INITIALIZED", False))

    worker.device_kind = lambda name: StandIn("cuda", "nccl", "cuda")
    args = worker.argparse.Namespace(device_type="cuda", fd=-1, dump_fd=-1,
                                     argv=["--rank", "0", "--replaced", "{}"])
    state = worker.WarmState(modules=[], sys_path=[sys.argv[2]], skip=json.loads(sys.argv[4]))
    replaced = worker._import_ahead(args, state, json.loads(sys.argv[3]))
    def execv(path, argv):
        print(json.dumps({"replaced": replaced, "argv": argv[1:]}))
        sys.stdout.flush()
        os._exit(0)
    os.execv = execv
    if replaced:
        worker._replace_template(args, state)
    print(json.dumps({"replaced": replaced, "argv": None}))
""")


def _worker_imports_ahead(case_root: Path, modules: list[str], skip: list[str] = ()) -> tuple[dict, str]:
    """A worker process's _import_ahead of `modules` with a stand-in device, and its
    replacement's command line (exec intercepted) when it asked for one."""
    proc = subprocess.run([sys.executable, "-c", WORKER_SCRIPT, str(REPO), str(case_root), json.dumps(modules),
                           json.dumps(list(skip))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout


def test_a_poisoned_template_is_replaced_once_and_says_so(modules):
    got, out = _worker_imports_ahead(modules, ["warmcase.good_a", "warmcase.starts_device", "warmcase.good_b"])
    assert got["replaced"] is True
    assert out.count("initialized cuda in the rank template") == 1, out
    argv = got["argv"]
    assert argv[:3] == ["-u", "-m", "distci.harness.worker"]
    assert argv.count("--replaced") == 1, "the replacement's state replaces the old one, never stacks"
    state = json.loads(argv[argv.index("--replaced") + 1])
    assert state["skip"] == ["warmcase.starts_device"]
    assert state["modules"] == ["warmcase.good_a"]
    # the replacement, given the same selection, leaves the module that poisoned its predecessor out
    again, out = _worker_imports_ahead(modules, ["warmcase.good_a", "warmcase.starts_device", "warmcase.good_b"],
                                       skip=state["skip"])
    assert again == {"replaced": False, "argv": None}, out


def test_a_clean_selection_never_replaces_the_template(modules):
    got, out = _worker_imports_ahead(modules, ["warmcase.good_a", "warmcase.good_b"])
    assert got == {"replaced": False, "argv": None}
    assert "initialized" not in out


DRIVER_SCRIPT = textwrap.dedent("""
    import json, os, sys, types
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, sys.argv[2])
    import torch
    from warmcase import probe
    from distci.harness import worker
    from distci.harness.devices import DeviceKind

    # torch.<module> of a stand-in device: never lazily initialized, yet its forks are "bad"
    # once warmcase.starts_driver was imported (torch's at-fork hook after is_available())
    torch.standin = types.SimpleNamespace(is_initialized=lambda: False, _is_in_bad_fork=lambda: probe.BAD_FORK)
    worker.device_kind = lambda name: DeviceKind("cuda", "nccl", "standin")
    args = worker.argparse.Namespace(device_type="cuda", fd=-1, dump_fd=-1, argv=["--rank", "0"])
    state = worker.WarmState(modules=["warmcase.good_a"], sys_path=[sys.argv[2]])
    replaced = worker._import_ahead(args, state, json.loads(sys.argv[3]))
    print(json.dumps({"replaced": replaced, "modules": state.modules, "skip": state.skip}))
""")


def test_an_import_that_poisons_fork_without_initializing_replaces_the_template(modules):
    """On an H100 a template that imported inductor's modules ahead passed the
    is_initialized() guard, then every fork failed "Cannot re-initialize CUDA in forked
    subprocess": something called is_available()/device_count(). The guard asks a fork."""
    batch = ["warmcase.good_b", "warmcase.starts_driver"]
    proc = subprocess.run([sys.executable, "-c", DRIVER_SCRIPT, str(REPO), str(modules), json.dumps(batch)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["replaced"] is True, proc.stdout
    assert got["skip"] == batch, "none of the batch is imported ahead again: which one did it is not known"
    assert got["modules"] == ["warmcase.good_a"], "the replacement imports only what stayed safe"
    assert "started cuda in the rank template" in proc.stdout
    clean = subprocess.run([sys.executable, "-c", DRIVER_SCRIPT, str(REPO), str(modules), json.dumps(["warmcase.good_b"])],
                           capture_output=True, text=True, timeout=120)
    assert json.loads(clean.stdout.strip().splitlines()[-1])["replaced"] is False, clean.stdout + clean.stderr


def test_learned_modules_keep_the_order_the_test_imported_them(modules):
    before = frozenset(sys.modules)
    import torch._dynamo  # noqa: F401 - may be imported already; then the order is checked on what is new

    learned = newly_imported(before)
    order = [m for m in sys.modules if m in set(learned)]
    assert learned == order, "alphabetical order imports a submodule before the package that breaks its cycle"


def test_building_an_optimizer_imports_what_a_device_template_imports_ahead():
    """A template that does not learn (on a device) imports OPTIMIZER_IMPORTS ahead because
    building a torch optimizer imports them lazily in every test's fork (4.3 s against 1.1 s an
    eager row on an H100). If a torch stops doing so, the list is stale: this says which."""
    from distci.harness.warm import OPTIMIZER_IMPORTS

    script = ("import sys, json, torch\n"
              "names = json.loads(sys.argv[1])\n"
              "before = [n for n in names if n in sys.modules]\n"
              "torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\n"
              "print(json.dumps({'before': before, 'after': [n for n in names if n in sys.modules]}))\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(list(OPTIMIZER_IMPORTS))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["before"] == [], f"`import torch` already imports {got['before']}: nothing to import ahead"
    assert got["after"] == list(OPTIMIZER_IMPORTS), f"an optimizer imported only {got['after']}"


def test_what_tests_imported_lazily_is_remembered_per_test_module(tmp_path: Path):
    record = tmp_path / "stack" / "learned-imports.json"
    assert remembered(record, ["suites.test_a"]) == []  # no record yet: nothing
    remember(record, JOINING, ["torch.distributed.x"])
    remember(record, "suites.test_a", ["torch._dynamo", "warmcase.helper", "torch.testing._internal", "torch.fx.y"])
    remember(record, "suites.test_a", ["torch.fx.y", "triton"])
    remember(record, "suites.test_b", ["torch.heavy"])
    assert remembered(record, ["suites.test_a"]) == ["torch.distributed.x", "torch._dynamo", "torch.fx.y", "triton"]
    assert remembered(record, ["suites.test_c"]) == ["torch.distributed.x"], "another module's are not imported"
    assert remembered(record, ["suites.test_b", "suites.test_a"])[:2] == ["torch.distributed.x", "torch.heavy"]
    record.write_text("{not json")
    assert remembered(record, ["suites.test_a"]) == []  # a hint: a broken record is an empty one
    remember(None, "suites.test_a", ["torch.x"])  # no record named: nothing kept, nothing raised
    assert remembered(None, ["suites.test_a"]) == []


@pytest.mark.slow
def test_the_next_session_imports_ahead_what_the_last_one_learned(tmp_path: Path):
    """The first test of a session used to import again, in its fork, every lazy import its
    module's tests made in the last session (Dynamo: seconds a rank); its template now has them."""
    out = tmp_path / "seen"
    out.mkdir()
    record = tmp_path / "learned-imports.json"
    for run in ("first", "second"):
        proc = run_pytest([str(CASES / "test_learned.py"), "--distci-run-dir", str(tmp_path / run)],
                          env={"DISTCI_CASE_OUT": str(out), "DISTCI_CASE_RUN": run, RECORD_ENV: str(record)})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = {path.name: path.read_text() for path in out.iterdir()}
    assert seen == {"first-rank0": "False", "first-rank1": "False", "second-rank0": "True", "second-rank1": "True"}
    keys = [k for k, names in json.loads(record.read_text()).items() if "torch.utils.show_pickle" in names]
    assert len(keys) == 1 and keys[0].endswith("test_learned"), keys
