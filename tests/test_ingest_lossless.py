"""Ingest never loses a good run, and JUnit is always valid XML (issue 28, Build 2).

Text a rank cannot decode (surrogate-escaped bytes), control characters pytest's own
junitxml escapes, a run that cannot be indexed among good ones, a writer that holds the
store's lock, and a registry change after the run: each case checks what a user sees.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fixtures_runs import stack, write_run

from distci.judge.ingest import ingest, ingest_runs
from distci.judge.store import SCHEMA_VERSION, Store, StoreError
from distci.results import write_junit, xml_text
from distci.rundir import JUNIT_FILE, RunDir

T0 = datetime(2026, 11, 20, 2, 0, tzinfo=timezone.utc)
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
A = "suites/test_tp_mlp.py::test_tp_mlp[none-none-sgd-pr]"
B = "suites/test_tp_mlp.py::test_tp_mlp[none-none-adamw-pr]"
S = stack("2.13.0+cpu", "5a" * 20)
# What a rank's raw output decodes to with errors="surrogateescape", plus the control
# characters (NUL, BEL, ESC) a terminal-coloured log carries.
HOSTILE = "RuntimeError: rank said " + b"\xff\xfe caf\xc3".decode("utf-8", "surrogateescape") + " \x00\x07\x1b[31mred\x1b[0m"


def _failed(test: str, message: str = HOSTILE) -> dict:
    return {"test_id": test, "outcome": "failed", "failure_kind": "exception", "message": message}


def test_three_runs_in_one_call_one_with_unencodable_text_all_land(tmp_path: Path) -> None:
    """The nightly aggregate ingests every artifact at once: the run whose message holds
    surrogate-escaped bytes is stored losslessly (escaped), the other two land too, and
    that run's junit.xml parses."""
    runs = tmp_path / "runs"
    write_run(runs, "r1", CELL, [{"test_id": A}, {"test_id": B}], started_at=T0, stack=S)
    hostile = write_run(runs, "r2", CELL, [{"test_id": A}, _failed(B)], started_at=T0 + timedelta(days=1), stack=S)
    write_run(runs, "r3", CELL, [{"test_id": A}, {"test_id": B}], started_at=T0 + timedelta(days=2), stack=S)

    report = ingest([runs], tmp_path / "store.sqlite")
    assert sorted(report.added) == ["r1", "r2", "r3"] and not report.rejected and report.results == 6
    with Store(tmp_path / "store.sqlite") as s:
        row = s.result("r2", B)
        assert [r.run_id for r in s.runs()] == ["r1", "r2", "r3"]
    # nothing lost: the undecodable bytes are escaped, not dropped or replaced
    assert "\\udcff\\udcfe caf\\udcc3" in row.excerpt and "\x1b[31mred" in row.excerpt
    root = ET.parse(hostile / JUNIT_FILE).getroot()
    failure = root.find(".//failure")
    assert failure is not None and "#xDCFF#xDCFE caf#xDCC3" in failure.text and "#x00#x07#x1B[31mred" in failure.text


def test_junit_escapes_what_xml_forbids_as_pytest_does(tmp_path: Path) -> None:
    """What pytest's bin_xml_escape escapes (every character XML 1.0 forbids, and DEL) is
    `#xHH` / `#xHHHH`, in attributes and text alike; everything else is kept."""
    assert xml_text("a\x00b\x07c\x1bd\x7fe\ud800f\ufffeg\U0001f600") == "a#x00b#x07c#x1Bd#x7Fe#xD800f#xFFFEg\U0001f600"
    runs = tmp_path / "runs"
    run = write_run(runs, "r", CELL, [_failed(A), {"test_id": B, "outcome": "skipped", "message": "no \x0c GPU"}],
                    started_at=T0, stack={**S, "device_name": "cpu\x00"})
    ET.parse(run / JUNIT_FILE)  # parses: plain ElementTree wrote NUL and ESC raw before


@pytest.mark.slow
def test_our_junit_escapes_like_pytests_own(tmp_path: Path) -> None:
    """pytest's --junitxml of the same hostile message escapes it the way ours does."""
    run = write_run(tmp_path / "runs", "r", CELL, [_failed(A)], started_at=T0, stack=S)
    test = tmp_path / "test_hostile.py"
    test.write_text(f"def test_x():\n    raise RuntimeError({HOSTILE!r})\n")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test),
                    f"--junitxml={tmp_path / 'pytest.xml'}"], capture_output=True, cwd=tmp_path, timeout=120)
    theirs = ET.parse(tmp_path / "pytest.xml").getroot().find(".//failure").get("message")
    ours = ET.parse(run / JUNIT_FILE).getroot().find(".//failure").text
    assert "#x00#x07#x1B[31mred" in theirs and "#x00#x07#x1B[31mred" in ours


def test_a_run_that_cannot_be_indexed_is_reported_and_the_others_land(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run is its own transaction: one whose rows the database refuses is rejected by
    path with the reason, and the runs before and after it are kept."""
    runs = tmp_path / "runs"
    write_run(runs, "r1", CELL, [{"test_id": A}], started_at=T0, stack=S)
    write_run(runs, "r2", CELL, [{"test_id": A}], started_at=T0 + timedelta(days=1), stack=S)
    write_run(runs, "r3", CELL, [{"test_id": A}], started_at=T0 + timedelta(days=2), stack=S)
    db = tmp_path / "store.sqlite"
    with Store(db) as s:
        # a trigger makes the database refuse r2's rows, the way a constraint or a full disk does
        s.conn.execute("CREATE TRIGGER no_r2 BEFORE INSERT ON results WHEN NEW.run_id = 'r2' "
                       "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
        report = ingest_runs(s, [runs])
        assert [r.run_id for r in s.runs()] == ["r1", "r3"]
        assert s.results(run_id="r2") == []
    assert sorted(report.added) == ["r1", "r3"]
    assert report.rejected == [f"{runs / 'r2'}: not indexed (IntegrityError: refused by the test)"]
    assert f"{runs / 'r2'}: not indexed" in report.summary()


@pytest.mark.slow
def test_a_lock_wait_is_bounded_and_names_the_holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer holding the store (here a child process in a transaction) makes an
    ingest give up after DISTCI_STORE_LOCK_TIMEOUT with who holds it, not wait for hours."""
    db = tmp_path / "store.sqlite"
    write_run(tmp_path / "runs", "r1", CELL, [{"test_id": A}], started_at=T0, stack=S)
    Store(db).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from distci.judge.store import Store\n"
         f"s = Store({str(db)!r})\nwith s.transaction():\n    print('holding', flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        monkeypatch.setenv("DISTCI_STORE_LOCK_TIMEOUT", "1.5")
        start = time.monotonic()
        with pytest.raises(StoreError) as exc:
            with Store(db) as s:
                ingest_runs(s, [tmp_path / "runs"])
        waited = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait()
    assert 1.4 < waited < 15, waited
    assert f"pid {holder.pid}" in str(exc.value) and "DISTCI_STORE_LOCK_TIMEOUT" in str(exc.value)
    monkeypatch.setenv("DISTCI_STORE_LOCK_TIMEOUT", "soon")
    with pytest.raises(StoreError, match="DISTCI_STORE_LOCK_TIMEOUT='soon'"):
        Store(db)


def test_ingest_rewrites_junit_from_the_judged_verdicts(tmp_path: Path) -> None:
    """JUnit written at run time knew no registry; `ingest --junit` rewrites it from the
    store: the known issue matched at index time is skipped with its id, a failure judged
    flaky from history is a flakyFailure, so JUnit, gate, dashboard and HUD agree."""
    registry = tmp_path / "known_issues.toml"
    registry.write_text('[[issue]]\nid = "upstream-123"\ntests = ["suites/test_tp_mlp.py::*sgd*"]\n'
                        'signature = "guessed its metadata incorrectly"\n')
    runs = tmp_path / "runs"
    for n, outcome in enumerate(["passed", "failed", "passed"]):  # B flips: known-flaky by the third flip
        write_run(runs, f"h{n}", CELL, [{"test_id": B, "outcome": outcome}], started_at=T0 + timedelta(hours=n),
                  stack=S)
    message = "RuntimeError: the compiled region guessed its\nmetadata incorrectly"
    last = write_run(runs, "last", CELL, [_failed(A, message), _failed(B, "AssertionError: off by 1")],
                     started_at=T0 + timedelta(days=1), stack=S)
    before = ET.parse(last / JUNIT_FILE).getroot()
    assert len(before.findall(".//failure")) == 2
    db = tmp_path / "store.sqlite"
    from distci.judge import ingest as ingest_mod

    assert ingest_mod.main([str(runs), "--store", str(db), "--known-issues", str(registry), "--junit"]) == 0
    with Store(db) as s:
        assert (s.result("last", A).verdict, s.result("last", B).verdict) == ("xfail", "flaky")
    after = ET.parse(last / JUNIT_FILE).getroot()
    cases = {c.get("name"): c for c in after.iter("testcase")}
    a, b = cases[A.rpartition("::")[2]], cases[B.rpartition("::")[2]]
    assert a.find("skipped").get("type") == "pytest.xfail" and "upstream-123" in a.find("skipped").get("message")
    assert {p.get("name"): p.get("value") for p in a.iter("property")}["known_issue"] == "upstream-123"
    assert b.find("failure") is None and b.find("flakyFailure") is not None
    assert after.find("testsuite").get("failures") == "0" and after.find("testsuite").get("skipped") == "1"


def test_an_older_store_is_upgraded_in_place(tmp_path: Path) -> None:
    """A store of schema 1 (before run.json's ci block) or 2 (before `selection`) opens as
    the current schema with its runs kept: the index is upgraded, never thrown away."""
    runs, db = tmp_path / "runs", tmp_path / "store.sqlite"
    write_run(runs, "r1", CELL, [{"test_id": A}], started_at=T0, stack=S)
    ingest([runs], db)
    for version, dropped in ((2, ("selection_json",)), (1, ("selection_json", "ci_json", "image"))):
        conn = sqlite3.connect(db)
        for column in dropped:
            if column in {r[1] for r in conn.execute("PRAGMA table_info(runs)")}:
                conn.execute(f"ALTER TABLE runs DROP COLUMN {column}")
        conn.execute("DROP INDEX IF EXISTS results_history")  # schema 4: results carry their run's start
        conn.execute("ALTER TABLE results DROP COLUMN run_started_at")
        conn.execute(f"PRAGMA user_version = {version}")
        conn.commit()
        conn.close()
        with Store(db) as s:
            assert [r.run_id for r in s.runs()] == ["r1"] and s.runs()[0].selection == []
            assert s.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
            assert [tuple(r) for r in s.conn.execute("SELECT run_started_at FROM results")] == [(s.runs()[0].started_at,)]


# Lines where a fast JSON parser could answer otherwise than json: integers past 64 bits
# (orjson reads them as floats), lone surrogates, NaN and infinities, deep nesting, a BOM,
# bytes that are not UTF-8, duplicate keys, raw control characters, non-ASCII text.
ODD_LINES = [b'{"a": 123456789012345678901234567890}', b'{"a": -9223372036854775809}', b'{"a": 18446744073709551615}',
             b'{"a": "\\udc80x"}', b'{"a": "\\ude00\\ud83d"}', b'{"a": NaN}', b'{"a": 1e400}', b'{"a": -Infinity}',
             b"[" * 1500 + b"]" * 1500, b'\xef\xbb\xbf{"a": 1}', b'{"a": "\xff\xfe"}', b'{"a": "\xed\xa0\x80"}',
             b'{"a": 1, "a": 2}', b'{"a": "x\ty"}', b'{"a": "caf\xc3\xa9 \\u00e9 \\ud83d\\ude00"}', b' {"a": 0.1} \r\n']


@pytest.mark.parametrize("raw", ODD_LINES)
def test_a_results_line_reads_as_json_reads_it(raw: bytes) -> None:
    from distci import results

    assert results.orjson is not None, "orjson is a dependency of the controller: the fast path is the one tested"

    def read(fn):
        try:
            return "value", repr(fn(raw))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            return "error", type(exc).__name__
    expected = read(lambda b: json.loads(b.decode("utf-8")))
    got = read(results.load_line)
    assert got == expected


def test_junit_says_the_real_first_line_and_a_known_issue_keeps_its_text_and_ranks(tmp_path: Path) -> None:
    """A JUnit reader shows `message`: it is the failure's own first line with its numbers
    (`SQNR 12.5 dB`), not the number-masked signature that groups bugs; a known issue's
    <skipped> carries the failure's text and every rank's excerpt, as a failure does."""
    from distci.results import RankExcerpt, Result, error_signature

    text = "AssertionError: SQNR 12.5 dB below 20 dB\nfull details"
    ranks = [RankExcerpt(0, "failed", "rank 0 saw 12.5"), RankExcerpt(1, "failed", "rank 1 saw 12.4")]
    failed = Result(run_id="r", cell_id=CELL, test_id=A, outcome="failed", failure_kind="assert", message=text,
                    error_signature=error_signature("AssertionError", text.split(": ", 1)[1]), stack={}, ranks=ranks)
    known = Result(run_id="r", cell_id=CELL, test_id=B, outcome="failed", failure_kind="assert", message=text,
                   error_signature=failed.error_signature, stack={}, ranks=ranks, known_issue="upstream-9")
    assert "12.5" not in failed.error_signature, "the signature masks numbers (else this test proves nothing)"
    root = ET.parse(write_junit([failed, known], tmp_path / "j.xml")).getroot()
    cases = {c.get("name"): c for c in root.iter("testcase")}
    failure = cases[A.rpartition("::")[2]].find("failure")
    assert failure.get("message") == "AssertionError: SQNR 12.5 dB below 20 dB"
    skipped = cases[B.rpartition("::")[2]].find("skipped")
    assert skipped.get("message") == "known issue upstream-9: AssertionError: SQNR 12.5 dB below 20 dB"
    assert "full details" in skipped.text and "rank 1 saw 12.4" in skipped.text


def test_the_nightly_rewrites_tonights_artifact_junit_from_the_verdicts(tmp_path: Path) -> None:
    """The workflow's test reporter reads the artifacts' junit.xml after the aggregate: a
    failure the registry explains at index time must be a skip there, as it is for the gate."""
    from distci.ci.nightly import rewrite_artifact_junit

    registry = tmp_path / "known_issues.toml"
    registry.write_text('[[issue]]\nid = "upstream-123"\ntests = ["suites/test_tp_mlp.py::*sgd*"]\n'
                        'signature = "guessed its metadata incorrectly"\n')
    artifacts = tmp_path / "artifacts"
    run = write_run(artifacts, "tonight", CELL, [_failed(A, "RuntimeError: guessed its metadata incorrectly")],
                    started_at=T0, stack=S)
    never_indexed = write_run(tmp_path / "elsewhere", "other", CELL, [_failed(A, "RuntimeError: boom")],
                              started_at=T0, stack=S)
    assert ET.parse(run / JUNIT_FILE).getroot().find(".//failure") is not None, "run-time JUnit: red"
    with Store(tmp_path / "store.sqlite") as store:
        ingest_runs(store, [artifacts], known_issues=registry)
        assert rewrite_artifact_junit(store, [run, never_indexed]) == 1
    after = ET.parse(run / JUNIT_FILE).getroot()
    assert after.find(".//failure") is None and "upstream-123" in after.find(".//skipped").get("message")
    assert ET.parse(never_indexed / JUNIT_FILE).getroot().find(".//failure") is not None, "not indexed: kept"
