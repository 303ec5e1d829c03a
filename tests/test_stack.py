"""The Stack record: one list of keys, a lossless JSON round trip, the env fingerprint."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distci.stack import ENV_KEYS, KEYS, SUMMARY_KEYS, Stack, capture
from distci.judge.verdicts import env_key


def test_capture_is_a_stack_and_round_trips() -> None:
    data = capture(import_torch=False)
    assert set(KEYS) - {"partial", "declared", "runner", "error"} <= set(data)
    assert Stack.from_dict(data).to_dict() == data
    newer = {**data, "some_future_key": [1, 2]}
    assert Stack.from_dict(newer).extra == {"some_future_key": [1, 2]}
    assert Stack.from_dict(newer).to_dict() == newer


def test_env_and_summary_keys_come_from_the_record() -> None:
    assert set(ENV_KEYS) <= set(KEYS) and set(SUMMARY_KEYS) <= set(KEYS)
    assert {"torch", "torch_git", "packages", "device_name"} <= set(ENV_KEYS)
    assert "hostname_label" not in ENV_KEYS and "platform" not in ENV_KEYS
    a = Stack(torch="2.13.0", torch_git="a" * 40, hostname_label="runner-1").to_dict()
    b = {**a, "hostname_label": "runner-2", "unrelated": 1}
    assert env_key(a) == env_key(b)
    assert env_key(a) != env_key({**a, "torch_git": "b" * 40})


def test_a_partial_stack_says_so() -> None:
    stack = Stack(partial=True, declared={"torch": "2.13.0"}, error="no index").to_dict()
    assert stack["partial"] is True and stack["declared"] == {"torch": "2.13.0"} and stack["error"] == "no index"
    assert "partial" not in Stack(torch="2.13.0").to_dict()


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                     lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
                     max_leaves=6)
_NAMES = st.sampled_from(KEYS) | st.sampled_from(("extra", "written", "git_version")) | st.text(max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_NAMES, _JSON, max_size=12))
def test_any_stack_dict_round_trips_exactly(data: dict) -> None:
    """Partial dicts, unknown keys (even `extra`), None as written: the same keys back, in
    the same order, so results.jsonl and the store's stack_json keep their bytes."""
    back = Stack.from_dict(data).to_dict()
    assert back == data
    assert list(back) == list(data)


def test_a_read_stack_reads_by_attribute_and_keeps_what_is_set() -> None:
    stack = Stack.from_dict({"torch": "2.5.0", "packages": None, "future": 1})
    assert stack.torch == "2.5.0" and stack.packages is None and stack.python is None
    assert stack.extra == {"future": 1}
    stack.torch_git = "abc"
    assert stack.to_dict() == {"torch": "2.5.0", "packages": None, "future": 1, "torch_git": "abc"}


def test_a_stack_is_a_json_object() -> None:
    with pytest.raises(TypeError, match="JSON object, not list"):
        Stack.from_dict([1])  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_NAMES, _JSON, max_size=12), _NAMES)
def test_get_answers_as_the_stored_object_does(data: dict, key: str) -> None:
    assert Stack.from_dict(data).get(key, "absent") == data.get(key, "absent")
    built = Stack(torch="2.5.0")
    assert built.get(key, "absent") == built.to_dict().get(key, "absent")
