"""Fault injection on the inputs (issue 41, Build 3): no registry, matrix, store or report
content makes a command hang, spin, eat memory or print a traceback.

Each case is data: a bad input (how it is damaged), the command that reads it, and the
words its one error line must hold. One runner executes the real command line
(`distci.cli.main`, the code `python -m distci` runs) and asserts: exit code 2, exactly one
line on stderr, naming the input's file (and line where there is one), no traceback, and
bounded time and memory. What needs its own process (the pytest plugin inside a cell, a
full disk, a killed ingest) runs as a subprocess below. docs/reliability.md lists them.
"""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pytest
from fixtures_runs import stack, write_run

from conftest import REPO
from distci import cli
from distci.publish.export import hud_rows
from distci.judge.ingest import ingest
from distci.judge.store import Store
from distci.run.cellrun import QUIET_PLUGINS

T0 = datetime(2026, 11, 20, 2, 0, tzinfo=timezone.utc)
CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
TEST = "suites/test_tp_mlp.py::test_tp_mlp[none-none-sgd-pr]"
S = stack("2.13.0+cpu", "5a" * 20)
TIME_BOUND_S = 30.0
MEMORY_BOUND = 64 << 20  # bytes Python may allocate at the peak of one command

GOOD_REGISTRY = '''[[issue]]
id = "pytorch1-one"
title = "one"
tests = ["suites/test_tp_mlp.py::*"]
signature = "boom"
upstream = "https://github.com/pytorch/pytorch/issues/1"
[issue.applies]
torch = ">=2.5"
'''


def _registry(text: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        path = tmp / "known_issues.toml"
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        return path
    return make


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Path], Path]
    """Writes the bad input under a temporary directory; returns its path."""
    words: str
    """A regex the one error line must match (after the file name)."""
    line: int | None = None
    """The line of the file the error must name, where it has one."""


REGISTRY_CASES = [
    Case("catastrophic-signature", _registry(GOOD_REGISTRY.replace('"boom"', '"(a+)+$"')),
         r"\[\[issue\]\] pytorch1-one: 'signature' is refused: it repeats a group", 5),
    Case("backreference-signature", _registry(GOOD_REGISTRY.replace('"boom"', r'"(a)\\1"')), r"backreference", 5),
    Case("signature-matches-everything", _registry(GOOD_REGISTRY.replace('"boom"', '"x*"')),
         r"matches an empty message", 5),
    Case("invalid-regex", _registry(GOOD_REGISTRY.replace('"boom"', '"(unclosed"')), r"not a valid regex", 5),
    Case("wrong-type", _registry(GOOD_REGISTRY.replace('tests = ["suites/test_tp_mlp.py::*"]', "tests = 3")),
         r"'tests' must be a non-empty string or a list", 4),
    Case("unknown-key", _registry(GOOD_REGISTRY.replace("signature =", "signatur =")),
         r"unknown key 'signatur' \(did you mean 'signature'\?\)", 5),
    Case("unknown-applies-key", _registry(GOOD_REGISTRY.replace("torch =", "torhc =")),
         r"applies: unknown key 'torhc' \(did you mean 'torch'\?\)", 8),
    Case("unknown-table", _registry(GOOD_REGISTRY + "\n[issues]\nx = 1\n"), r"unknown top-level key 'issues' \(did you mean 'issue'\?\)", 10),
    Case("missing-key", _registry(GOOD_REGISTRY.replace('signature = "boom"\n', "")), r"missing key 'signature'", 1),
    Case("duplicate-id", _registry(GOOD_REGISTRY + "\n" + GOOD_REGISTRY.split("[issue.applies]")[0]),
         r"duplicate id \(first at .*:1\)", 10),
    Case("bad-specifier", _registry(GOOD_REGISTRY.replace('">=2.5"', '"two point five"')), r"not a version specifier", 8),
    Case("bad-date", _registry(GOOD_REGISTRY + 'nightly_from = "2026-13-01"\n'), r"'nightly_from' = '2026-13-01' is not a date", 9),
    Case("unquoted-date", _registry(GOOD_REGISTRY + 'nightly_until = 2026-11-01\n'),
         r"'nightly_until' must be a quoted date string \(write \"2026-11-01\"\)", 9),
    Case("applies-not-a-table", _registry(GOOD_REGISTRY.split("[issue.applies]")[0] + 'applies = "torch>=2"\n'),
         r"'applies' must be a table", 7),
    Case("invalid-toml", _registry(GOOD_REGISTRY + "[[issue]\n"), r"invalid TOML", 9),
    Case("not-utf8", _registry(b"\xff\xfe[[issue]]\n"), r"not UTF-8", None),
    Case("nested-too-deep", _registry("x = " + "[" * 100000 + "]" * 100000 + "\n"), r"nested deeper than the parser",
         None),
]


def _matrix(old: str, new: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        text = (REPO / "matrix.toml").read_text()
        assert old in text, old
        path = tmp / "matrix.toml"
        path.write_text(text.replace(old, new, 1))
        return path
    return make


def _matrix_line(needle: str) -> int:
    return next(i for i, line in enumerate((REPO / "matrix.toml").read_text().splitlines(), 1) if line.startswith(needle))


MATRIX_CASES = [
    Case("shards-a-billion", _matrix("shards = 2", "shards = 1000000000"), r"shards must be a whole number from 1 to 256",
         _matrix_line("shards = 2")),
    Case("jobs-past-github", _matrix("shards = 2", "shards = 200"), r"jobs \(cells x shards\) is past GitHub's 256",
         _matrix_line("shards = 2")),
    Case("world-size-huge", _matrix("world_size = 2", "world_size = 100000"), r"'world_size' = 100000 is past",
         _matrix_line("world_size = 2")),
    Case("timeout-huge", _matrix("timeout = 300", "timeout = 1000000000"), r"'timeout' = 1000000000 is past",
         _matrix_line("timeout = 300")),
    Case("block-past-github", _matrix('torch = ["2.13.0", "2.14.1", "2.15.0"]',
                                      "torch = [" + ", ".join(f'"==2.{n}.0"' for n in range(300)) + "]"),
         r"expands to \d+ cells, past GitHub's 256", None),
    Case("wrong-type", _matrix("world_size = 2", 'world_size = "two"'), r"'world_size' must be a positive integer",
         _matrix_line("world_size = 2")),
    Case("unknown-key", _matrix('torch = "latest"', 'torhc = "latest"'), r"unknown key 'torhc' \(did you mean 'torch'\?\)",
         None),
    Case("not-utf8", lambda tmp: (tmp / "matrix.toml").write_bytes(b"schema = 1\n\xff\xfe\n") and tmp / "matrix.toml",
         r"not UTF-8", None),
    Case("nested-too-deep", _matrix("schema = 1\n", "schema = 1\nx = " + "[" * 100000 + "]" * 100000 + "\n"),
         r"nested deeper than the parser", None),
]


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], path: Path, case: Case) -> None:
    tracemalloc.start()
    start = time.monotonic()
    try:
        code = cli.main(argv)
    finally:
        elapsed = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    out, err = capsys.readouterr()
    lines = err.splitlines()
    if argv[argv.index("run") if "run" in argv else 0] == "run" and lines[-1:] and lines[-1].startswith("distci: exit 2:"):
        lines = lines[:-1]  # `run` names its exit code on its last line, whichever way it ends
    assert code == 2, (out, err)
    assert len(lines) == 1 and "Traceback" not in out + err, err
    where = f"{path}:{case.line}: " if case.line else f"{path}"
    assert lines[0].startswith(f"distci: error: {where}"), lines[0]
    assert re.search(case.words, lines[0]), lines[0]
    assert elapsed < TIME_BOUND_S and peak < MEMORY_BOUND, (elapsed, peak)


@pytest.fixture
def one_run(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    write_run(runs, "r1", CELL, [{"test_id": TEST, "outcome": "failed", "message": "a" * 40 + "!"}],
              started_at=T0, stack=S)
    return runs


@pytest.mark.parametrize("case", REGISTRY_CASES, ids=lambda c: c.name)
def test_a_bad_registry_is_one_line_in_ingest(case: Case, tmp_path: Path, one_run: Path, capsys) -> None:
    path = case.make(tmp_path)
    _one_line(capsys, ["ingest", str(one_run), "--store", str(tmp_path / "s.sqlite"), "--known-issues", str(path)],
              path, case)
    assert not (tmp_path / "s.sqlite").exists() or not Store(tmp_path / "s.sqlite").runs()


@pytest.mark.parametrize("command", ["run", "report", "dashboard", "ingest-rebuild"])
def test_a_bad_registry_is_one_line_in_every_command(command: str, tmp_path: Path, one_run: Path, capsys) -> None:
    case = REGISTRY_CASES[0]
    path = case.make(tmp_path)
    store = tmp_path / "s.sqlite"
    ingest([one_run], store)
    argv = {
        "run": ["--matrix", str(REPO / "matrix.toml"), "run", "--known-issues", str(path), "--runs-root",
                str(tmp_path / "new")],
        "report": ["report", str(one_run / "r1"), "--title", "t", "--command", "c", "--known-issues", str(path)],
        "dashboard": ["dashboard", "--store", str(store), "--out", str(tmp_path / "site"), "--known-issues", str(path)],
        "ingest-rebuild": ["ingest", str(one_run), "--rebuild", "--store", str(store), "--known-issues", str(path)],
    }[command]
    _one_line(capsys, argv, path, case)
    assert not (tmp_path / "new").exists()  # the run's controller refused before provisioning anything


@pytest.mark.parametrize("case", MATRIX_CASES, ids=lambda c: c.name)
def test_a_bad_matrix_is_one_line(case: Case, tmp_path: Path, capsys) -> None:
    path = case.make(tmp_path)
    _one_line(capsys, ["--matrix", str(path), "matrix", "--json"], path, case)


@pytest.mark.parametrize("command", ["gate", "run"])
def test_a_bad_matrix_is_one_line_in_every_command(command: str, tmp_path: Path, one_run: Path, capsys) -> None:
    case = MATRIX_CASES[0]
    path = case.make(tmp_path)
    store = tmp_path / "s.sqlite"
    ingest([one_run], store)
    argv = {"gate": ["--matrix", str(path), "gate", "--store", str(store)],
            "run": ["--matrix", str(path), "run", "--runs-root", str(tmp_path / "new")]}[command]
    _one_line(capsys, argv, path, case)


# ------------------------------------------------------------------------------- the store


@pytest.fixture(scope="module")
def damaged_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store with 4 KiB of random bytes written over one of its pages (built once)."""
    root = tmp_path_factory.mktemp("damaged")
    for n in range(12):
        write_run(root / "runs", f"r{n}", CELL, [{"test_id": f"{TEST}{i}"} for i in range(20)], started_at=T0,
                  stack=S, durable=False)
    store = root / "s.sqlite"
    ingest([root / "runs"], store)
    with sqlite3.connect(store) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = store.stat().st_size
    with open(store, "r+b") as fh:
        fh.seek((size // 2) // 4096 * 4096)
        fh.write(random.Random(41).randbytes(4096))
    return store


@pytest.mark.parametrize("command", ["ingest", "gate", "dashboard", "export"])
def test_a_damaged_store_is_one_line_never_ingested_or_passed(command: str, tmp_path: Path, one_run: Path,
                                                               damaged_store: Path, capsys) -> None:
    store = tmp_path / "s.sqlite"
    store.write_bytes(damaged_store.read_bytes())
    argv = {
        "ingest": ["ingest", str(one_run), "--store", str(store), "--known-issues", str(tmp_path / "none.toml")],
        "gate": ["--matrix", str(REPO / "matrix.toml"), "gate", "--store", str(store), "--tier", "pr"],
        "dashboard": ["dashboard", "--store", str(store), "--out", str(tmp_path / "site")],
        "export": ["export", "--hud", "--store", str(store), "--out", str(tmp_path / "hud.json")],
    }[command]
    _one_line(capsys, argv, store, Case("damaged", lambda t: store, r"the store is damaged.*--rebuild"))


@pytest.mark.parametrize("command", ["dashboard", "export"])
def test_a_stored_value_distci_never_writes_is_one_line(command: str, tmp_path: Path, one_run: Path, capsys) -> None:
    """Damage quick_check cannot see (a page whose structure holds, its JSON edited)."""
    store = tmp_path / "s.sqlite"
    ingest([one_run], store)
    with sqlite3.connect(store) as conn:
        conn.execute("UPDATE runs SET stack_json = '{\"torch\": ' WHERE run_id = 'r1'")
    argv = {"dashboard": ["dashboard", "--store", str(store), "--out", str(tmp_path / "site")],
            "export": ["export", "--hud", "--store", str(store), "--out", str(tmp_path / "hud.json")]}[command]
    _one_line(capsys, argv, Path("run 'r1'"), Case("content", lambda t: store, r"its stored stack_json is not JSON"))


def test_a_store_damaged_after_its_last_check_is_checked_again(damaged_store: Path) -> None:
    """The note that spares an unchanged store its quick_check (CHECKED_SUFFIX) was written
    when the fixture's ingest closed it; the bytes written since make the next open check."""
    from distci.errors import StoreError
    from distci.judge.store import CHECKED_SUFFIX

    assert damaged_store.with_name(damaged_store.name + CHECKED_SUFFIX).exists()
    with pytest.raises(StoreError, match="the store is damaged"):
        Store(damaged_store, reading=True)


def test_every_reader_sees_one_snapshot_while_an_ingest_commits(tmp_path: Path, one_run: Path) -> None:
    store = tmp_path / "s.sqlite"
    ingest([one_run], store)
    with Store(store, reading=True) as reader:
        before = [r.run_id for r in reader.runs()]
        write_run(one_run, "r2", CELL, [{"test_id": TEST}], started_at=T0.replace(day=21), stack=S)
        ingest([one_run], store)  # commits while the reader is open
        assert [r.run_id for r in reader.runs()] == before == ["r1"]
        assert {r.run_id for r in reader.results()} == {"r1"}
    with Store(store, reading=True) as later:
        assert [r.run_id for r in later.runs()] == ["r1", "r2"]


def test_a_run_that_never_ended_is_in_progress_on_hud(tmp_path: Path, one_run: Path) -> None:
    write_run(one_run, "r2", CELL, [{"test_id": TEST}], started_at=T0.replace(day=21), stack=S)
    info = json.loads((one_run / "r2" / "run.json").read_text())
    info["ended_at"] = ""
    info["exit_code"] = None
    (one_run / "r2" / "run.json").write_text(json.dumps(info))
    store = tmp_path / "s.sqlite"
    ingest([one_run], store)
    with Store(store, reading=True) as s:
        rows = {r.distci["run_id"]: r for r in hud_rows(s)}
    assert (rows["r1"].status, rows["r1"].conclusion) == ("completed", "failure")
    assert (rows["r2"].status, rows["r2"].conclusion) == ("in_progress", "")


@pytest.mark.parametrize("content, words", [
    (b"5", r"a fix audit file is a list of rows"),
    (b'{"rows": 5}', r"a fix audit file is a list of rows"),
    (b"{not json", r"not valid JSON"),
    (b"[" * 100000, r"not valid JSON"),
])
def test_a_bad_report_json_is_one_line(content: bytes, words: str, tmp_path: Path, one_run: Path, capsys) -> None:
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "bad.json").write_bytes(content)
    _one_line(capsys, ["ingest", str(one_run), "--store", str(tmp_path / "s.sqlite"), "--audit-dir", str(audit),
                       "--known-issues", str(tmp_path / "none.toml")],
              audit / "bad.json", Case("json", lambda t: audit, words))


# -------------------------------------------------------------- what needs its own process


def test_a_bad_registry_in_a_cell_is_one_pytest_error_not_internalerror(tmp_path: Path) -> None:
    path = REGISTRY_CASES[0].make(tmp_path)
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "distci.harness.plugin", *QUIET_PLUGINS, "-q",
         f"--distci-run-dir={tmp_path / 'run'}", "--distci-cell=cpu-inputs", f"--distci-known-issues={path}",
         "test_one.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 4 and "INTERNALERROR" not in out and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("ERROR:")]
    assert len(errors) == 1 and f"{path}:5: [[issue]] pytorch1-one" in errors[0], out


def test_the_ingest_of_a_full_disk_is_one_line_naming_the_disk(tmp_path: Path, one_run: Path) -> None:
    for n in range(2, 12):
        write_run(one_run, f"r{n}", CELL, [{"test_id": f"{TEST}{i}", "message": "x" * 2000} for i in range(30)],
                  started_at=T0, stack=S, durable=False)
    store = tmp_path / "s.sqlite"
    limit = 256 * 1024

    def limited() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "distci", "ingest", str(one_run), "--store", str(store),
                           "--known-issues", str(tmp_path / "none.toml")],
                          capture_output=True, text=True, timeout=120, preexec_fn=limited, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(REPO), DISTCI_INGEST_READER="inline"))
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert lines[0].startswith(f"distci: error: {store}: the disk holding the store did not take a write"), lines[0]
    assert "MiB free there" in lines[0] and "DISTCI_STORE" in lines[0], lines[0]


# ------------------------------------------------------------- a signature that slips through


SLIPS_THROUGH = "(a|aa)+$"
"""Passes the load-time check (no repeated group repeats) yet backtracks exponentially on
forty a's and a `b`: only the time bound stops it."""


@pytest.mark.parametrize("engine", ["regex", "re-under-a-timer"])
def test_a_search_that_runs_out_of_time_says_so(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from distci import signatures

    if engine != "regex":
        monkeypatch.setattr(signatures, "_regex", None)  # as in a cell environment: stdlib re only
    pattern = signatures.compile_signature(SLIPS_THROUGH)
    start = time.monotonic()
    assert signatures.search(pattern, "a" * 60 + "b", budget_s=0.2) is None
    assert time.monotonic() - start < 5
    assert signatures.search(pattern, "xx aaa", budget_s=0.2) is True


def test_a_stalling_signature_explains_nothing_and_ingest_names_it(tmp_path: Path, capsys) -> None:
    runs = tmp_path / "runs"
    write_run(runs, "r1", CELL, [{"test_id": f"{TEST}{i}", "outcome": "failed", "message": "a" * 60 + "b"}
                                 for i in range(5)], started_at=T0, stack=S)
    registry = _registry(GOOD_REGISTRY.replace('"boom"', f'"{SLIPS_THROUGH}"'))(tmp_path)
    start = time.monotonic()
    code = cli.main(["ingest", str(runs), "--store", str(tmp_path / "s.sqlite"), "--known-issues", str(registry)])
    out = capsys.readouterr().out
    assert code == 0 and time.monotonic() - start < TIME_BOUND_S
    assert f"{registry}:1: [[issue]] pytorch1-one: 'signature' ran over" in out, out
    with Store(tmp_path / "s.sqlite") as s:
        assert {r.verdict for r in s.results()} == {"fail"} and not any(r.known_issue for r in s.results())


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="ingest starts a reader process only with a second CPU")
def test_a_killed_ingest_leaves_no_reader_behind(tmp_path: Path) -> None:
    """SIGKILL while the reader process prepares runs: the reader dies with it (PDEATHSIG)."""
    from distci.harness import procs

    runs = tmp_path / "runs"
    for n in range(40):
        write_run(runs, f"r{n:02d}", CELL, [{"test_id": f"{TEST}{i}"} for i in range(300)],
                  started_at=T0.replace(minute=n), stack=S, durable=False)
    env = {k: v for k, v in os.environ.items() if k != "DISTCI_INGEST_READER"}
    proc = subprocess.Popen([sys.executable, "-m", "distci", "ingest", str(runs), "--store", str(tmp_path / "s.sqlite"),
                             "--known-issues", str(tmp_path / "none.toml")], cwd=tmp_path,
                            env=dict(env, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    readers: list[int] = []
    while not readers and time.monotonic() < deadline and proc.poll() is None:
        readers = procs.descendants(proc.pid)
        time.sleep(0.05)
    assert readers, "the ingest never started its reader (needs 2 CPUs)"
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in readers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in readers if Path(f"/proc/{pid}").exists()
            and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]
    assert not left, f"reader(s) {left} outlived the killed ingest"


def test_a_stalling_signature_in_a_cell_is_bounded_with_stdlib_re(tmp_path: Path) -> None:
    """A cell environment has no `regex`: the plugin's matcher bounds stdlib re with a timer,
    the failure stays a failure, and the run names the entry on stderr."""
    registry = _registry(GOOD_REGISTRY.replace('"boom"', f'"{SLIPS_THROUGH}"').replace(
        "suites/test_tp_mlp.py::*", "test_one.py::*"))(tmp_path)
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert False, 'a' * 60 + 'b'\n")
    run_dir = tmp_path / "run"
    without_regex = ("import sys; sys.modules['regex'] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))")
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", without_regex, "-p", "distci.harness.plugin", "-p", "no:cacheprovider", "-q",
         f"--distci-run-dir={run_dir}", "--distci-cell=cpu-inputs", f"--distci-known-issues={registry}", "test_one.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and time.monotonic() - start < 60 and "Traceback" not in proc.stderr, out
    assert f"distci: {registry}:1: [[issue]] pytorch1-one: 'signature' ran over" in proc.stderr, out
    (result,) = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert result["outcome"] == "failed" and not result.get("known_issue"), result
