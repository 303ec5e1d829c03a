"""The `docker_client` fixture: a client of a running dockerd, started here when installed but not running.

CI (.ci/run) starts dockerd itself; elsewhere the fixture starts it when it can (root,
docker.io installed) and stops it, by pid, at the end; otherwise the tests skip. Nothing
can be pulled in these tests, so the fixture sets DISTCI_BASE_IMAGE=local for them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest


def _ping() -> bool:
    import docker

    try:
        docker.from_env(timeout=5).ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means: no daemon answering
        return False


@pytest.fixture(scope="session")
def docker_client(tmp_path_factory):
    """A client of a running dockerd; started here (and stopped by pid) when installed but not running."""
    docker = pytest.importorskip("docker", reason="the Docker SDK is not installed (pip install 'distci[docker]')")
    if shutil.which("dockerd") is None:
        pytest.skip("docker.io is not installed (apt-get install docker.io)")
    previous = os.environ.get("DISTCI_BASE_IMAGE")
    os.environ["DISTCI_BASE_IMAGE"] = "local"  # nothing can be pulled here
    proc = None
    if not _ping():
        if os.geteuid() != 0:
            pytest.skip("dockerd is installed but not running, and starting it needs root")
        log = tmp_path_factory.mktemp("dockerd") / "dockerd.log"
        with log.open("w") as out:
            proc = subprocess.Popen(["dockerd"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not _ping():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.skip(f"dockerd did not start: {log.read_text()[-500:]}")
            time.sleep(0.5)
    try:
        yield docker.from_env(timeout=3600)
    finally:
        if previous is None:
            os.environ.pop("DISTCI_BASE_IMAGE", None)
        else:
            os.environ["DISTCI_BASE_IMAGE"] = previous
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
