"""distci's own wheels (provision/selfwheels.py) built by two processes at once, as two cell runs
or two test workers do: the wheel the first one finished stays, since the other may be installing it."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from distci.provision import selfwheels
from distci.provision.files import sha256_file


def test_a_wheel_another_process_finished_meanwhile_is_kept(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / f"distci_fixes-{selfwheels.source_hash(*selfwheels.SOURCES['distci_fixes'])}"
    theirs = out / "distci_fixes-0.1.0-py3-none-any.whl"

    def pip_wheel(cmd, **kw):  # this build, and meanwhile the other process's finishing first
        Path(cmd[cmd.index("-w") + 1], "distci_fixes-0.1.0-py3-none-any.whl").write_bytes(b"ours")
        out.mkdir()
        theirs.write_bytes(b"theirs")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(selfwheels.subprocess, "run", pip_wheel)
    built = selfwheels.build_wheel("distci_fixes", tmp_path, log=lambda m: None)
    assert built == theirs and theirs.read_bytes() == b"theirs"
    assert [p.name for p in tmp_path.iterdir()] == [out.name], "no build left behind"


@pytest.mark.slow
def test_the_same_sources_build_the_same_bytes(tmp_path: Path) -> None:
    """Two builds of one source tree, in two caches and two seconds apart (a zip stamps files
    to the 2 s): the same bytes, so an env that holds one is current for the other and is not
    reinstalled under a run using it (a test's copy of the checkout, a bisect's working dir)."""
    first = selfwheels.build_wheel("distci_fixes", tmp_path / "a", log=lambda m: None)
    time.sleep(2.1)
    second = selfwheels.build_wheel("distci_fixes", tmp_path / "b", log=lambda m: None)
    assert first != second and sha256_file(first) == sha256_file(second)
