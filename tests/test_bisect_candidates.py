"""Candidate lists, and the nightly path end to end without the internet.

The nightly test writes dated dev wheels of a tiny package by hand (1.0.devYYYYMMDD, one
per night, whose `add` breaks on one date), serves them as a PEP 503 index from
127.0.0.1, lists them with the same code that reads PyTorch's nightly index, and
bisects with probes that pip-install each nightly into a cached venv and run a command.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import hashlib
import http.server
import json
import re
import threading
import zipfile
from pathlib import Path

import pytest

from distci import cli
from distci.bisect import BisectState, bisect
from distci.bisect.candidates import (
    nightly_candidates,
    release_candidates,
    wheelhouse_candidates,
)
from distci.bisect.checks import CommandCheck
from distci.bisect.install import EnvCache
from distci.bisect.probes import WheelProbe
from distci.bisect.report import format_result, result_to_dict
from distci.errors import SourceError

PACKAGE = "distci-probe-demo"
MODULE = "distci_probe_demo"
BROKEN_ON = dt.date(2026, 3, 8)
CHECK = f"python -c 'import sys, {MODULE} as m; sys.exit(0 if m.add(2, 2) == 4 else 1)'"


@pytest.fixture(autouse=True)
def _archive(tmp_path, monkeypatch):
    """Probes download into the wheelhouse archive: a test's own, not the checkout's."""
    monkeypatch.setenv("DISTCI_WHEELHOUSE_ROOT", str(tmp_path / "wheelhouse"))
    monkeypatch.setenv("DISTCI_ENV_ROOT", str(tmp_path / "envs"))


def write_wheel(directory: Path, version: str, source: str, tag: str = "py3-none-any") -> Path:
    """A minimal valid wheel of the demo package (METADATA, WHEEL, RECORD with hashes)."""
    dist_info = f"{MODULE}-{version}.dist-info"
    files = {
        f"{MODULE}/__init__.py": source,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: distci-tests\nRoot-Is-Purelib: true\nTag: {tag}\n",
    }
    record = [f"{name},sha256={_b64digest(text.encode())},{len(text.encode())}" for name, text in files.items()]
    files[f"{dist_info}/RECORD"] = "\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n"
    path = directory / f"{MODULE}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def _b64digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def nightly_source(day: dt.date) -> str:
    result = "a + b + 1" if day >= BROKEN_ON else "a + b"
    return f"BUILT = {day.isoformat()!r}\n\ndef add(a, b):\n    return {result}\n"


def write_simple_index(root: Path, wheels: list[Path]) -> None:
    """A PEP 503 page for the demo package, links relative, with sha256 fragments."""
    page = root / "simple" / PACKAGE
    page.mkdir(parents=True)
    links = "\n".join(
        f'<a href="../../files/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a><br/>'
        for w in wheels
    )
    (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}\n</body></html>\n")
    (root / "simple" / "index.html").write_text(f'<a href="{PACKAGE}/">{PACKAGE}</a>\n')


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture
def nightly_index(tmp_path, monkeypatch):
    """Nightlies 2026-03-01..12 without the 6th and 7th (no build that weekend), the 10th
    built only for another platform; served on 127.0.0.1."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    root = tmp_path / "index"
    files = root / "files"
    files.mkdir(parents=True)
    wheels = []
    for n in range(1, 13):
        day = dt.date(2026, 3, n)
        if day in (dt.date(2026, 3, 6), dt.date(2026, 3, 7)):
            continue
        tag = "cp27-cp27m-win32" if day == dt.date(2026, 3, 10) else "py3-none-any"
        wheels.append(write_wheel(files, f"1.0.dev{day:%Y%m%d}", nightly_source(day), tag))
    write_simple_index(root, wheels)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.slow
def test_nightly_bisect_over_a_local_pep503_index_lands_on_the_date(nightly_index, tmp_path, capsys):
    candidates = nightly_candidates(nightly_index, PACKAGE, first="2026-03-01", last="1.0.dev20260312")
    dates = [c.date.day for c in candidates]
    assert dates == [1, 2, 3, 4, 5, 8, 9, 11, 12]
    assert candidates[0].key == f"{PACKAGE}==1.0.dev20260301"
    assert candidates[0].pip_args() == ["--index-url", nightly_index]

    cache = EnvCache(tmp_path / "bisect")
    probe = WheelProbe(CommandCheck(CHECK, cwd=tmp_path, timeout=60), cache)
    events = []
    cold = bisect(candidates, probe, state=BisectState(), on_event=events.append)
    assert cold.kind == "boundary"
    assert (cold.last_good.date, cold.first_bad.date) == (dt.date(2026, 3, 5), BROKEN_ON)
    assert len(cold.probes) <= 3 + 2
    assert all(r.cached is False for r in cold.probes)
    assert "step 1 of about 5 [verify]" in str(events[0])

    # the same question through `python -m distci bisect`, reusing the environments
    argv = ["bisect", "--command", CHECK, "--good", "2026-03-01", "--bad", "2026-03-12", "--axis", PACKAGE,
            "--index-url", nightly_index, "--cache", str(tmp_path / "bisect"), "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "bisect distci-probe-demo (nightly): 9 candidates" in out
    assert "first bad: distci-probe-demo==1.0.dev20260308 (last good: distci-probe-demo==1.0.dev20260305)" in out
    report_path = Path(re.search(r"^report: (.+)$", out, re.MULTILINE).group(1))
    report = json.loads(report_path.read_text())
    assert report["first_bad"] == f"{PACKAGE}==1.0.dev20260308"
    assert report["probes"][0]["details"]["date"] == "2026-03-12"
    # every candidate the first search made is warm; the CLI's flanks (2 a side by default)
    # are candidates that search never probed, so theirs are the only cold envs
    assert all(r["cached"] is (r["phase"] != "flank") for r in report["probes"]), report["probes"]
    assert {r["phase"] for r in report["probes"] if r["cached"] is False} == {"flank"}
    cold_seconds = result_to_dict(cold)["timing"]["cold"]["mean_seconds"]
    assert report["timing"]["warm"]["mean_seconds"] < cold_seconds
    print(format_result(cold), out, sep="\n")

    # run again: the state answers every probe, nothing is installed or run
    assert cli.main(argv) == 0
    again = json.loads(report_path.read_text())
    assert set(again["timing"]) == {"resumed"} and again["first_bad"] == report["first_bad"]


def test_nightly_endpoints_must_be_on_the_index(nightly_index):
    with pytest.raises(
        SourceError, match="no distci-probe-demo nightly 2026-03-07 .*nearest: 2026-03-04, 2026-03-05, 2026-03-08"
    ):
        nightly_candidates(nightly_index, PACKAGE, first="2026-03-07", last="2026-03-12")
    with pytest.raises(SourceError, match="neither a date"):
        nightly_candidates(nightly_index, PACKAGE, last="March 12")
    lone = nightly_candidates(nightly_index, PACKAGE, last="20260309", limit=3)
    assert [c.date.day for c in lone] == [5, 8, 9]


def test_release_candidates_skip_prereleases_between_endpoints(tmp_path):
    index = tmp_path / "simple"
    files = tmp_path / "files"
    files.mkdir()
    versions = ["0.9", "1.0", "1.1rc1", "1.1", "1.2.dev20260101", "1.2", "2.0rc1"]
    write_simple_index(tmp_path, [write_wheel(files, v, "") for v in versions])
    url = index.as_uri()
    found = release_candidates(url, PACKAGE, first="1.0", last="1.2")
    assert [c.version for c in found] == ["1.0", "1.1", "1.2"]
    assert [c.version for c in release_candidates(url, PACKAGE, first="1.0", last="2.0rc1")] == [
        "1.0",
        "1.1",
        "1.2",
        "2.0rc1",
    ]
    assert len(release_candidates(url, PACKAGE, first="1.0", last="1.2", prereleases=True)) == 5
    with pytest.raises(SourceError, match="no distci-probe-demo release 1.3 .* nearest: 1.1, 1.2"):
        release_candidates(url, PACKAGE, first="1.0", last="1.3")


def test_wheelhouse_candidates_order_versions_and_dates(tmp_path):
    house = tmp_path / "wheelhouse"
    house.mkdir()
    for version in ["1.0.dev20260302", "1.0.dev20260228", "0.9", "1.0.dev20260301"]:
        write_wheel(house, version, "")
    (house / "unrelated-1.0-py3-none-any.whl").write_bytes(b"")
    by_version = wheelhouse_candidates(house, PACKAGE, first="0.9", last="1.0.dev20260302")
    assert [c.version for c in by_version] == ["0.9", "1.0.dev20260228", "1.0.dev20260301", "1.0.dev20260302"]
    assert by_version[0].pip_args() == ["--no-index", "--find-links", str(house.resolve())]
    by_date = wheelhouse_candidates(house, PACKAGE, first="2026-03-01", last="2026-03-02")
    assert [c.date.day for c in by_date] == [1, 2]


def test_a_nightly_gone_from_the_index_is_still_a_candidate_from_the_wheelhouse_archive(nightly_index, tmp_path):
    """The index has no 2026-03-06 build (any more); distci downloaded it once into the
    archive (here: from a directory that is gone afterwards), so it is still bisected."""
    from distci.provision.wheelhouse import archived, ensure_wheelhouse

    kept = tmp_path / "once"
    kept.mkdir()
    write_wheel(kept, "1.0.dev20260306", nightly_source(dt.date(2026, 3, 6)))
    archive = tmp_path / "archive"
    ensure_wheelhouse([f"{PACKAGE}==1.0.dev20260306"], ["--no-index", "--find-links", str(kept)], archive,
                      log=lambda line: None)
    for wheel in kept.iterdir():
        wheel.unlink()
    found = nightly_candidates(nightly_index, PACKAGE, first="2026-03-05", last="2026-03-08",
                               archive=archived(archive, PACKAGE))
    assert [(c.date.day, c.source) for c in found] == [(5, "nightly"), (6, "wheelhouse"), (8, "nightly")]
    probe = WheelProbe(CommandCheck(CHECK, cwd=tmp_path, timeout=60), EnvCache(tmp_path / "bisect"))
    assert probe(found[1]).outcome == "good"


def test_without_an_index_url_releases_come_from_the_indexes_of_pips_configuration(tmp_path):
    from distci.bisect.candidates import merge_release_candidates
    from distci.provision.pipconfig import PYPI_SIMPLE, pip_index_urls

    one, two = tmp_path / "one", tmp_path / "two"
    for root, versions in ((one, ["1.0", "1.1"]), (two, ["1.2", "2.0"])):
        (root / "files").mkdir(parents=True)
        write_simple_index(root, [write_wheel(root / "files", v, "") for v in versions])
    conf = {"global.index-url": (one / "simple").as_uri(), "global.extra-index-url": (two / "simple").as_uri()}
    urls = pip_index_urls(environ={}, config=conf)
    assert urls == [(one / "simple").as_uri(), (two / "simple").as_uri()]
    assert pip_index_urls(environ={"PIP_INDEX_URL": "file:///x"}, config=conf)[0] == "file:///x"
    assert pip_index_urls(environ={}, config={})[0] == PYPI_SIMPLE
    found = merge_release_candidates(urls, PACKAGE, first="1.1", last="2.0")
    assert [c.version for c in found] == ["1.1", "1.2", "2.0"]
    assert all(c.pip_args() == [] for c in found)  # pip installs them with its own configuration
