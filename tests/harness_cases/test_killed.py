"""A run whose runner is killed at once (SIGKILL) mid-test: test_harness_live_junit.py reads what it left."""

import os
import signal


def test_first():
    assert True


def test_second_is_skipped():
    import pytest

    pytest.skip("skipped on purpose")


def test_killed_here():
    os.kill(os.getpid(), signal.SIGKILL)  # this process is pytest's: the runner dies in this test


def test_never_started():
    assert True
