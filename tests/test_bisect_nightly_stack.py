"""A nightly candidate with a test id: the stack's other packages come from pip's own index.

A real nightly index (download.pytorch.org/whl/nightly/<variant>) serves torch and its
dependencies (a CUDA nightly's pytorch-triton is only there), never pytest. A test-id
bisect's candidate env is "the nightly + pytest + packaging": resolved in one pip call
with the nightly's `--index-url`, pytest was looked up on the nightly index alone, and
every candidate was an infra skip (found measuring the nightlies mode on a local proxy of
the nightly index, with pip's configuration naming only the ordinary index).
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from distci.bisect.candidates import nightly_candidates
from distci.bisect.install import Base, EnvCache
from distci.provision.envs import env_python

NIGHTLY = "distci-probe-nightly"
ONLY_ON_NIGHTLY = "distci-probe-triton"  # pinned by the nightly, served by its index only
FROM_PIP = "distci-probe-harness"  # what the harness needs: on pip's own index only


def wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    module = name.replace("-", "_")
    dist_info = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{module}/__init__.py": f"VERSION = {version!r}\n", f"{dist_info}/METADATA": metadata,
             f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: distci-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{n},sha256={_b64(t.encode())},{len(t.encode())}" for n, t in files.items()]
    files[f"{dist_info}/RECORD"] = "\n".join(record + [f"{dist_info}/RECORD,,"]) + "\n"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, t in files.items():
            zf.writestr(n, t)
    return path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index of `wheels` under root/simple; its file:// URL."""
    by_name: dict[str, list[Path]] = {}
    for w in wheels:
        by_name.setdefault(w.name.split("-")[0].replace("_", "-"), []).append(w)
    for name, files in by_name.items():
        page = root / "simple" / name
        page.mkdir(parents=True)
        page.joinpath("index.html").write_text("".join(
            f'<a href="{w.resolve().as_uri()}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a><br/>\n'
            for w in files))
    return (root / "simple").as_uri()


@pytest.mark.slow  # two pip resolutions and a uv install: 14 s at load 17
def test_a_nightly_with_a_test_ids_harness_gets_the_harness_from_pips_own_index(tmp_path, monkeypatch):
    nightly_files, pip_files = tmp_path / "nightly-files", tmp_path / "pip-files"
    nightly = [wheel(nightly_files, NIGHTLY, f"1.0.dev2026030{day}", (f"{ONLY_ON_NIGHTLY}==1.0+git1",))
               for day in (1, 2)]
    nightly_url = simple_index(tmp_path / "nightly", [*nightly, wheel(nightly_files, ONLY_ON_NIGHTLY, "1.0+git1")])
    pip_url = simple_index(tmp_path / "pypi", [wheel(pip_files, FROM_PIP, "2.0")])
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {pip_url}\n")  # a runner's pip: one ordinary index
    for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX", "PIP_CONSTRAINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("DISTCI_WHEELHOUSE_ROOT", str(tmp_path / "wheelhouse"))
    monkeypatch.setenv("DISTCI_ENV_ROOT", str(tmp_path / "envs"))

    candidates = nightly_candidates(nightly_url, NIGHTLY, first="2026-03-01", last="2026-03-02")
    assert [c.version for c in candidates] == ["1.0.dev20260301", "1.0.dev20260302"]
    cache = EnvCache(tmp_path / "cache", base=Base(requirements=(FROM_PIP,)), log=lambda line: None)
    env, warm = cache.stack(candidates[1])
    assert not warm
    got = subprocess.run([str(env_python(env)), "-c", "import distci_probe_nightly as n, distci_probe_triton as t, "
                          "distci_probe_harness as h; print(n.VERSION, t.VERSION, h.VERSION)"],
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split() == ["1.0.dev20260302", "1.0+git1", "2.0"]
    assert cache.stack(candidates[1]) == (env, True)
