"""Inductor's on-disk caches across the forks of one run, and evidence that survives a hit
(distci.harness.compile_cache, suites/evidence.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest import CASES, run_pytest
from distci.harness.compile_cache import CACHE_ENV, LEARNED_RECORD, compile_cache_dir, compile_cache_env
from distci.harness.warm import RECORD_ENV


def test_the_ranks_cache_is_the_stacks_per_fixes_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv(RECORD_ENV, raising=False)
    here = compile_cache_dir(tmp_path, fixes="all")
    if sys.prefix != sys.base_prefix and os.access(sys.prefix, os.W_OK):  # a venv: the stack's own directory
        assert Path(sys.prefix) in here.parents
        assert compile_cache_dir(tmp_path / "other-run", fixes="all") == here, "runs of a stack share it"
        assert compile_cache_dir(tmp_path, fixes="none") != here, "fix selections never share it"
    else:
        assert here == tmp_path / "compile-cache"
    assert compile_cache_env(tmp_path) == {CACHE_ENV: str(compile_cache_dir(tmp_path)),
                                           RECORD_ENV: str(compile_cache_dir(tmp_path) / LEARNED_RECORD)}


def test_a_cache_directory_the_caller_chose_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RECORD_ENV, raising=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert compile_cache_env(tmp_path) == {RECORD_ENV: str(compile_cache_dir(tmp_path) / LEARNED_RECORD)}
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "learned.json"))
    assert compile_cache_env(tmp_path) == {}


@pytest.mark.slow
def test_a_second_identical_compiled_test_hits_the_cache_with_the_same_evidence(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    out.mkdir()
    cache = tmp_path / "inductor-cache"  # fresh: the first test must compile, the second may not
    proc = run_pytest([str(CASES / "test_compile_cache.py"), "--distci-run-dir", str(tmp_path / "run")],
                      env={"DISTCI_CASE_OUT": str(out), CACHE_ENV: str(cache)}, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:]
    seen = {(attempt, rank): json.loads((out / f"{attempt}-rank{rank}.json").read_text())
            for attempt in ("first", "second") for rank in (0, 1)}
    # The first test's ranks compile into the fresh cache (one rank may hit a graph its peer
    # has just saved: a hit whose evidence must be whole too); the second compiles nothing.
    assert sum(seen["first", rank]["fx_misses"] for rank in (0, 1)) > 0, seen
    first = seen["first", 0]
    assert first["graphs"] >= 2 and first["ops"].get("aten::mm"), f"forward and backward graphs counted: {first}"
    for rank in (0, 1):
        second = seen["second", rank]
        assert second["fx_misses"] == 0 and second["fx_hits"] + second["aot_hits"] > 0, second
        for attempt in ("first", "second"):
            got = seen[attempt, rank]
            assert got["compile_fx_ahead"], "a `compiles` test's fork starts with inductor imported"
            assert got["cache_dir"] == str(cache)
            assert (got["graphs"], got["ops"], got["loss"]) == (first["graphs"], first["ops"], first["loss"]), got
