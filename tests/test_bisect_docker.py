"""`distci bisect --backend docker`: the bisect runs in the cell's image, probing with the image's Python.

The docker test bisects a wheelhouse of a tiny package (1.2 broke it) with a check that
fails outright outside the cell image (it looks for the image's /distci/suites), so the
bisect can only find 1.2 if every probe ran in the container.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from conftest import REPO
from distci.bisect.docker import in_image_argv, path_mounts
from dockerd import docker_client  # noqa: F401 - the session fixture
from test_wheelhouse_envs import write_wheel

DEFAULT_CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
CHECK = ("python -c \"import os, sys, tinybisect; assert os.path.isdir('/distci/suites'), 'not in the cell image'; "
         "sys.exit(1 if tinybisect.__version__ >= '1.2' else 0)\"")


def test_the_container_gets_the_same_question_with_the_images_python():
    argv = ["--command", "true", "--backend", "docker", "--image-cell=c", "--python", "/usr/bin/python3",
            "--good", "1", "--", "t::x"]
    assert in_image_argv(argv, "/venv/bin/python") == ["--command", "true", "--good", "1",
                                                       "--python=/venv/bin/python", "--", "t::x"]
    assert in_image_argv(["--bad", "2"], "/p") == ["--bad", "2", "--python=/p"]


def test_paths_of_the_arguments_are_mounted_at_their_own_paths(tmp_path):
    (tmp_path / "wh").mkdir()
    mounts = path_mounts(["--wheelhouse", str(tmp_path / "wh"), f"--report={tmp_path / 'new' / 'r.json'}",
                          f"--out={tmp_path}"], REPO)
    assert set(mounts) == {str(REPO.resolve()), str(tmp_path.resolve())}  # nested paths fold into their parent
    assert all(m["bind"] == p and m["mode"] == "rw" for p, m in mounts.items())


@pytest.mark.docker
def test_a_bisect_in_the_cells_image_finds_the_first_bad_version(docker_client, tmp_path):  # noqa: F811
    job = f"test-{uuid.uuid4().hex[:8]}"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for version in ("1.0", "1.1", "1.2", "1.3"):
        write_wheel(wheels, "tinybisect", version)
    proc = subprocess.run(
        [sys.executable, "-m", "distci", "bisect", "--backend", "docker", "--image-cell", DEFAULT_CELL,
         "--command", CHECK, "--source", "wheelhouse", "--wheelhouse", str(wheels), "--no-index",
         "--axis", "tinybisect", "--good", "1.0", "--bad", "1.3",
         "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out")],
        cwd=REPO, capture_output=True, text=True, timeout=900, env={**os.environ, "DISTCI_JOB": job})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"bisect: in image distci/cpu:{DEFAULT_CELL}-" in out
    assert "first bad: tinybisect==1.2 (last good: tinybisect==1.1)" in out, out[-4000:]
    (report_path,) = (tmp_path / "out").rglob("report*.json")
    assert json.loads(report_path.read_text())["first_bad"] == "tinybisect==1.2"
    assert docker_client.containers.list(all=True, filters={"label": f"distci.job={job}"}) == []
