"""The generated history and the store benchmark, at a size a test can afford.

The generator must give what the benchmark claims to measure: exactly the matrix's
cells, the nights and tests asked for, an upstream break in the nightly-torch cells,
known issues in the fixes-off cells, and run directories `ingest` reads as real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distci.bench.history import BREAK_SIG, Shape, cell_ids, generate
from distci.bench.history import test_ids as generated_ids
from distci.bench.store import StoreFigures, measure, nights_for
from distci.judge.ingest import ingest_runs
from distci.judge.store import Store
from distci.matrix import load_matrix


def test_generated_history_is_the_shape_asked_for_and_ingests_as_real_runs(tmp_path: Path) -> None:
    shape = Shape(nights=5, cells=50, tests=8, seed=3)
    history = generate(tmp_path / "h", shape)
    assert sorted(c.id for c in load_matrix(history.matrix).select()) == sorted(history.cells) == sorted(cell_ids(50))
    assert [c.id for c in load_matrix(history.matrix).select(tier="release")] == \
        [c for c in history.cells if "torch_2.14.1" in c and c.endswith("fix_on")]
    assert len(set(generated_ids(300))) == 300 and len(history.tests) == 8
    groups = list(history.night_groups())
    assert len(groups) == 5 and all(len(list(g.iterdir())) == 50 for g in groups)
    lines = [json.loads(line) for g in groups for run in g.iterdir() for line in (run / "results.jsonl").open()]
    infra = [r for r in lines if r["failure_kind"] == "infra"]
    assert len(lines) == shape.results - len(infra) * (shape.tests - 1)
    with Store(tmp_path / "store.sqlite") as store:
        report = ingest_runs(store, groups)
        assert report.results == len(lines) and not report.rejected and not report.bad_lines
        breaks = store.results(verdicts=["regression", "fail"])
        upstream = [r for r in breaks if r.error_signature == BREAK_SIG]
        assert upstream and all("torch_nightly" in r.cell_id and "test_float8" in r.test_id for r in upstream)
        known = store.results(verdicts=["xfail"])
        assert known and all(r.cell_id.endswith("fix_off") and r.known_issue for r in known)
    again = generate(tmp_path / "again", shape)
    first = next(next(again.night_groups()).iterdir())
    assert (first / "results.jsonl").read_text() == \
        (next(next(history.night_groups()).iterdir()) / "results.jsonl").read_text().replace(
            str(tmp_path / "h"), str(tmp_path / "again")), "deterministic for a seed"


@pytest.mark.slow
def test_store_bench_measures_ingest_gate_and_a_split_dashboard(tmp_path: Path) -> None:
    figures = measure(tmp_path / "x1", 1, cells=50, tests=8)
    assert isinstance(figures, StoreFigures) and figures.nights == nights_for(1) == 4
    assert figures.results > 0.9 * 4 * 50 * 8 and figures.ingest_rate > 0 and figures.ingest_cpu_rate > 0
    assert figures.gate_status in ("PASSED", "BLOCKED", "INCOMPLETE") and figures.gate_s > 0
    site = tmp_path / "x1" / "site"
    assert len(list(site.glob("cell-*.html"))) == 50 and len(list(site.glob("tier-*.html"))) == 2
    assert list(site.glob("week-*.html")) and figures.pages == len(list(site.glob("*.html")))
    assert figures.index_bytes == (site / "index.html").stat().st_size < figures.site_bytes
    assert set(figures.goals()) == {"ingest_rate", "gate_s", "dashboard_s"} and figures.built == "ingested"
    grown = measure(tmp_path / "x3", 3, grow_from=figures, source=tmp_path / "x1")
    assert grown.built == "grown from 1x" and grown.nights == 3 * 4 + 1 and set(grown.goals()) == {"gate_s", "dashboard_s"}
    assert 3 * figures.results < grown.results <= 3 * figures.results + 50 * 8, "three blocks and tonight"
    with Store(tmp_path / "x3" / "store.sqlite") as store:
        runs = store.runs()
        assert len(runs) == 3 * 4 * 50 + 50 and len({r.run_id for r in runs}) == len(runs)
        nights = sorted({r.night for r in runs})
        assert len(nights) == 13 and nights[0] == "2025-12-01" and nights[-1] == "2025-12-13"
    assert len(list((tmp_path / "x3" / "site").glob("week-*.html"))) == 2
