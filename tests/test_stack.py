"""The Stack record: one list of keys, a lossless JSON round trip, the env fingerprint."""

from __future__ import annotations

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
