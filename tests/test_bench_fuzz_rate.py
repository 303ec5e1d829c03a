"""The generators' throughput benches (`nox -s bench -- fuzz-ops | fuzz-programs`): the rate they
print and write, the load beside it, and the exit code against the issue-40 goal."""

from __future__ import annotations

import json

import pytest

from distci.bench import fuzz_rate


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str) -> None:
        self.lines.append(text)


@pytest.mark.parametrize("count, seconds, code", [(30, 300.0, 0), (20, 300.0, 1)])
def test_the_rate_is_judged_against_the_goal_with_the_load_beside_it(tmp_path, monkeypatch, count, seconds, code):
    monkeypatch.setattr(fuzz_rate, "REPO", tmp_path)
    monkeypatch.setattr(fuzz_rate, "bench_cell", lambda: "the cell")
    seen = []

    def run(cell, runs):
        seen.append((cell, runs))
        return count, seconds, {"finds": 2}

    console = _Console()
    assert fuzz_rate.measure_rate(console, name="fuzz-x", noun="programs", goal_per_hour=300, run=run) == code
    assert seen == [("the cell", tmp_path / ".distci" / "bench-fuzz-x" / "runs")]
    written = json.loads((tmp_path / ".distci" / "bench-fuzz-x.json").read_text())
    assert written["per_hour"] == round(count / seconds * 3600) and written["finds"] == 2
    assert len(written["load_before"]) == 3 and len(written["load_after"]) == 3
    assert f"{written['per_hour']} programs/hour (load " in console.lines[0]
    assert console.lines[-1].endswith("met" if code == 0 else "NOT met")


def test_both_generator_benches_are_registered():
    from distci.bench.harness import add_parser
    import argparse

    sub = argparse.ArgumentParser().add_subparsers()
    parser = add_parser(sub)
    for what in ("fuzz-ops", "fuzz-programs"):
        assert parser.parse_args([what, "--budget-s", "60"]).budget_s == 60.0
    assert fuzz_rate.bench_cell().id == fuzz_rate.CELL  # the cell is in the matrix: fixes off, torch 2.13.0
