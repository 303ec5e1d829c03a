"""The error signature of a failure that wraps other failures (issue 40, the night runs' c5).

DCP raises one `CheckpointException` whose first line only says which ranks failed
(`CheckpointException ranks:dict_keys([0, 1])`), followed by each rank's traceback. Keyed on
that line, every DCP failure shared one signature: distinct causes collapsed into one find,
and a registered cause (a near miss) was never named. The exceptions here are real: a DCP
save and a failing load in this process (DCP runs without a process group as rank 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

from distci.known_issues import load_registry
from distci.results import error_signature, headline
from distci.stack import Stack

REPO = Path(__file__).resolve().parents[1]


def _failed_load(tmp_path: Path, saved: dict, wanted: dict) -> BaseException:
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    where = tmp_path / f"ckpt{len(list(tmp_path.iterdir()))}"
    dcp.save(saved, checkpoint_id=str(where))
    try:
        dcp.load(wanted, checkpoint_id=str(where))
    except BaseException as exc:  # noqa: BLE001 - CheckpointException derives from BaseException
        assert type(exc).__name__ == "CheckpointException", type(exc)
        return exc
    raise AssertionError(f"dcp.load of {list(wanted)} into a checkpoint of {list(saved)} did not fail ({torch.__version__})")


def _signature(exc: BaseException) -> str:
    return error_signature(f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc))


@pytest.fixture
def dcp_failures(tmp_path: Path) -> dict[str, BaseException]:
    """Two DCP loads failing for different reasons: a key the checkpoint lacks, a size mismatch."""
    import torch

    saved = {"model": torch.nn.Linear(4, 4).state_dict()}
    return {
        "missing_key": _failed_load(tmp_path, saved, {"model": torch.nn.Sequential(torch.nn.Linear(4, 4)).state_dict()}),
        "size_mismatch": _failed_load(tmp_path, saved, {"model": torch.nn.Linear(4, 3).state_dict()}),
    }


def test_distinct_dcp_failures_get_distinct_signatures_naming_their_cause(dcp_failures) -> None:
    missing, mismatch = _signature(dcp_failures["missing_key"]), _signature(dcp_failures["size_mismatch"])
    assert str(dcp_failures["missing_key"]).startswith("CheckpointException ranks:")  # the generic headline
    assert missing != mismatch
    assert "RuntimeError: Missing key in checkpoint state_dict: model.N.weight" in missing.replace(".0.", ".N."), missing
    assert "ValueError: Size mismatch between saved" in mismatch, mismatch
    assert "ranks:" not in missing + mismatch


def test_the_signature_of_a_wrapped_error_keeps_no_rank_count(dcp_failures) -> None:
    """The same cause on 2 ranks and on 4 (`dict_keys([0, 1])` vs `[0, 1, 2, 3]`) is one find."""
    text = str(dcp_failures["missing_key"])
    four = text.replace("ranks:dict_keys([0])", "ranks:dict_keys([0, 1, 2, 3])", 1)
    assert four != text
    assert error_signature("CheckpointException", four) == error_signature("CheckpointException", text)


def test_a_registered_dcp_cause_is_named_as_a_near_miss(tmp_path: Path) -> None:
    """The night runs' p2: a DCP load asking for optimizer state the checkpoint lacks is
    `distci-dsd-full-optim-load-with-grads`'s DCP face; with the generic headline as the
    signature no entry was named, and the find was filed as new."""
    import torch

    exc = _failed_load(tmp_path, {"model": {"w": torch.zeros(2)}},
                       {"model": {"w": torch.zeros(2)}, "optim": {"state": {"blocks.0.norm.weight": {"step": torch.zeros(())}}}})
    registry = load_registry(REPO / "suites" / "known_issues.toml")
    test_id = "suites/generators/programs_entry.py::test_program[tp-ws2-w8-l1-sgd:fwd_bwd,save,step,load]"
    stack = Stack.from_dict({"torch": "2.13.0+cpu", "accelerator": "cpu"})
    assert registry.near_misses(test_id, _signature(exc), str(exc), stack) == ["distci-dsd-full-optim-load-with-grads"]


@pytest.mark.parametrize("message, expected", [
    ("RuntimeError: boom\n  File \"x.py\", line 3\nmore", "RuntimeError: boom"),  # no wrapped traceback
    ("\n\n-- Process 1 terminated with the following error:\nTraceback (most recent call last):\n"
     "  File \"w.py\", line 9, in run\n    step()\nValueError: bad shard\n", "ValueError: bad shard"),
    ("outer\nTraceback (most recent call last):\n  File \"a.py\", line 1\n", "outer"),  # no inner error line
    ("", ""),
])
def test_headline_is_the_first_line_unless_it_heads_wrapped_tracebacks(message: str, expected: str) -> None:
    assert headline(message) == expected
