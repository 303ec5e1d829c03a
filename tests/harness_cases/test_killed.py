"""A run whose runner is killed at once (SIGKILL) mid-test: test_harness_live_junit.py reads what it left."""

import os
import signal


def test_first():
    assert os.getpid() > 0 and signal.SIGKILL != signal.SIGTERM  # the process the kill below ends


def test_second_is_skipped():
    import pytest

    pytest.skip("skipped on purpose")


def test_killed_here():
    os.kill(os.getpid(), signal.SIGKILL)  # this process is pytest's: the runner dies in this test


def test_never_started():
    raise AssertionError("runs after the SIGKILL above: the runner is already dead")
