"""dtensor_sdpa_cpu_strategy: its detect()/apply() against a sharding propagator, and its
strategies' values on 2 gloo ranks against the full-tensor sdpa.

The slow test runs tests/sdpa_strategy_ranks.py on 2 forked gloo ranks: sdpa forward and
backward over the placements the ops generator draws (Shard on every dim, Partial, Replicate),
sizes the mesh does not divide, causal, a DTensor attn_mask, scale, bf16 and f32, each output
and input gradient compared with the op on full tensors. The same run with a planted wrong
strategy (the heads-sharded outputs declared replicated) must fail: the check can fail.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types

import pytest

from distci.provision.selfwheels import REPO

sys.path.insert(0, str(REPO / "fixes"))  # as tests/test_fixes.py: installed or not
torch = pytest.importorskip("torch")

from distci_fixes.fixes import dtensor_sdpa_cpu_strategy as fix  # noqa: E402


class _Propagator:
    """The registries and registration call of torch's ShardingPropagator (torch 2.13's names)."""

    def __init__(self) -> None:
        self.op_strategy_funcs: dict = {}
        self.op_single_dim_strategy_funcs: dict = {}
        self.op_to_rules: dict = {}
        self.op_to_schema_info: dict = {}

    def register_op_strategy(self, op, strategy_func, schema_info=None) -> None:
        self.op_strategy_funcs[op] = strategy_func
        if schema_info is not None:
            self.op_to_schema_info[op] = schema_info


@pytest.fixture
def propagator(monkeypatch):
    found = _Propagator()
    monkeypatch.setattr(fix, "_propagator", lambda: found)
    return found


def test_a_propagator_without_the_cpu_flash_strategies_gets_both_once(propagator):
    ops_module = types.ModuleType("ops")
    forward, backward = fix._cpu_flash_ops()
    assert fix.detect(ops_module)
    fix.apply(ops_module)
    fix.apply(ops_module)  # idempotent: a registered op is left alone
    assert propagator.op_strategy_funcs == {forward: fix._forward_strategy, backward: fix._backward_strategy}
    assert not fix.detect(ops_module)
    assert propagator.op_to_schema_info[forward].static_argnum == 3


@pytest.mark.parametrize("registry", ["op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules"])
def test_a_torch_that_registers_its_own_strategy_keeps_it(propagator, registry):
    forward, backward = fix._cpu_flash_ops()
    upstream = object()
    getattr(propagator, registry).update({forward: upstream, backward: upstream})
    assert not fix.detect(types.ModuleType("ops"))  # not_needed
    getattr(propagator, registry).pop(backward)
    assert fix.detect(types.ModuleType("ops"))
    fix.apply(types.ModuleType("ops"))
    assert getattr(propagator, registry)[forward] is upstream  # only the missing backward is ours
    assert propagator.op_strategy_funcs[backward] is fix._backward_strategy


def test_a_vanished_registration_api_is_a_target_missing_naming_torch(monkeypatch):
    from torch.distributed.tensor._api import DTensor

    monkeypatch.setattr(DTensor._op_dispatcher, "sharding_propagator", types.SimpleNamespace())
    from distci_fixes.patching import TargetMissing

    with pytest.raises(TargetMissing, match=re.escape(f"register_op_strategy does not exist in torch {torch.__version__}")):
        fix.detect(types.ModuleType("ops"))


def _ranks(*modes: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DISTCI_FIXES": "none", "PYTHONPATH": os.pathsep.join([str(REPO / "fixes"), str(REPO)])}
    env.pop("SDPA_STRATEGY_MUTATE", None)
    return subprocess.run([sys.executable, str(REPO / "tests" / "sdpa_strategy_ranks.py"), *modes], env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_strategies_give_the_full_tensor_values_and_a_wrong_one_is_caught():
    """One process imports torch for both runs: the fix as it is, then a planted wrong strategy,
    each on its own two forked ranks (a rank of the second run never saw the first's state)."""
    done = _ranks("right", "wrong")
    out = done.stdout
    right = [line for line in out.splitlines() if line.startswith("right: ")]
    wrong = [line for line in out.splitlines() if line.startswith("wrong: ")]
    assert len(right) == 2 and re.fullmatch(r"right: \d+ cases agree", right[0]) and right[1] == "right: exit 0", \
        out[-4000:] + done.stderr[-4000:]
    assert wrong[-1] == "wrong: exit 1", out[-2000:] + done.stderr[-2000:]
    assert any("differs" in line or "shape" in line for line in wrong[:-1]), out[-2000:] + done.stderr[-2000:]
    assert done.returncode == 1, out[-2000:]  # the wrong run's
