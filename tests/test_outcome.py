"""How rank reports combine into one outcome (pure; the real thing is in test_harness.py)."""

from distci.harness.outcome import LAST_WORDS, RankState, combine
from distci.harness.protocol import RankReport

COLLECTIVE_STACK = 'Current thread 0x1 (most recent call first):\n  File "torch/distributed/distributed_c10d.py", line 1 in all_reduce\n'
COMPUTE_STACK = 'Current thread 0x1 (most recent call first):\n  File "suites/test_x.py", line 3 in test_x\n'


def passed(rank):
    return RankState(rank, report=RankReport(rank, "passed"))


def test_all_passed():
    assert combine([passed(0), passed(1)], 1.0).outcome == "passed"


def test_a_rank_that_ended_itself_is_a_crash_whose_message_is_its_diagnosis(capsys):
    """A rank's own watchdog that diagnosed the case (the ops pulses' deadlock) writes its last
    words before it exits: the Result's headline is that diagnosis, which the registry matches,
    not "exited with code 1". Another dead rank without words does not hide it; the last words
    of the log count (an earlier test's are not this one's: each test has its own log slice)."""
    from distci.harness.outcome import say_last_words

    say_last_words("clamp: every rank waits in a collective its peers never issue (a deadlock)\n  case x")
    said = capsys.readouterr().err
    log = "noise\n" + said + "Fatal Python error: ...\n"
    c = combine([RankState(0, exit_code=-9), RankState(1, exit_code=1, log=log)], 1.0)
    assert (c.outcome, c.failure_kind) == ("failed", "crash")
    assert c.message.startswith("rank 1 ended itself (ranks 0, 1 died): clamp: every rank waits"), c.message
    assert "\n  case x" in c.message
    assert "every rank waits in a collective" in c.signature
    bare = combine([RankState(0, exit_code=1, log="noise\n" + LAST_WORDS + "{not json\n")], 1.0)
    assert bare.message == "rank 0 exited with code 1"


def test_a_dead_rank_is_a_crash_even_if_others_failed():
    peer = RankState(0, report=RankReport(0, "failed", "exception", "RuntimeError", "Connection closed by peer"))
    c = combine([peer, RankState(1, exit_code=-11)], 1.0)
    assert (c.outcome, c.failure_kind) == ("failed", "crash")
    assert "SIGSEGV" in c.message and c.needs_rebuild


def test_stuck_in_collective_is_a_hang_and_plain_slowness_a_timeout():
    hang = combine([RankState(0, stuck=True, stack=COLLECTIVE_STACK), RankState(1, stuck=True, stack=COMPUTE_STACK)], 9)
    assert hang.failure_kind == "hang"
    slow = combine([RankState(0, stuck=True, stack=COMPUTE_STACK), RankState(1, stuck=True, stack=COMPUTE_STACK)], 9)
    assert slow.failure_kind == "timeout"
    waiting = combine([passed(0), RankState(1, stuck=True, stack=COMPUTE_STACK)], 9)
    assert waiting.failure_kind == "hang"


def test_collective_timeout_error_is_a_hang():
    rep = RankReport(0, "failed", "exception", "torch.distributed.DistBackendError",
                     "Timed out waiting 30000ms for recv operation", traceback="torch/distributed/distributed_c10d.py")
    assert combine([RankState(0, report=rep), passed(1)], 30).failure_kind == "hang"


def test_assertion_on_one_rank_fails_the_test_with_its_signature():
    rep = RankReport(1, "failed", "assert", "AssertionError", "loss 0.51 != 0.50 at step 3")
    c = combine([passed(0), RankState(1, report=rep)], 2)
    assert (c.outcome, c.failure_kind) == ("failed", "assert")
    assert c.signature == "AssertionError: loss N != N at step N"
    assert not c.needs_rebuild


def test_skip_on_ranks_is_a_skip():
    c = combine([RankState(0, report=RankReport(0, "skipped", message="no float8")), passed(1)], 0.1)
    assert (c.outcome, c.message) == ("skipped", "no float8")
