"""The daemon connection and the base images cell images build FROM.

By default a family builds FROM a maintained public image, pinned by digest in
`PUBLIC_BASES` (the one table of them), so a self-hosted runner needs nothing but
Docker and the docker group. A runner overrides it with DISTCI_<FAMILY>_BASE_IMAGE or
DISTCI_BASE_IMAGE (any image with python3 + venv + headers and gcc). The value `local`
selects the air-gapped fallback: a Debian base made once per machine by
docker/base/make-base.sh (debootstrap + docker import, no registry), tagged under the
public name so the build takes the same path as with the pulled image; this is what
distci's own tests use, since nothing can be pulled there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from distci.errors import ConfigError, InfraError
from distci.provision.selfwheels import REPO
from distci.provision.files import sha256_file

Log = Callable[[str], None]

FAMILIES = ("cpu", "cuda", "npu")
DOCKER_DIR = REPO / "docker"
BASE_RECIPE = DOCKER_DIR / "base" / "make-base.sh"
IMAGES_DIR = Path(".distci") / "images"
INPUTS_LENGTH = 12
BUILD_TIMEOUT_S = 3600
LOCAL = "local"


@dataclass(frozen=True)
class PublicBase:
    """A maintained public image a family builds FROM, for one Python."""

    name: str            # repository:tag, what the local fallback is tagged as
    digest: str | None   # sha256:..., the pin; None where no digest could be verified
    why: str
    prepare: tuple[str, ...] = ()
    """Distribution packages the image lacks for a cell build (NVIDIA's CUDA runtime images
    have no Python and no compiler): added once per runner and base by a networked build of
    docker/base/prepare.Dockerfile (ensure_prepared); the cell build stays offline."""

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.digest}" if self.digest else self.name


# (family, python) -> base. CPU: a full python image, not -slim: Inductor compiles C++ on
# CPU and Triton compiles its launchers in C, and an offline build cannot apt-get a
# compiler. CUDA: NVIDIA's CUDA runtime image (Ubuntu 24.04, so Python 3.12: the CUDA
# cells' Python), which sets up what the NVIDIA container toolkit expects; it has neither
# Python nor gcc, which `prepare` adds once. PyPI's CUDA wheels bring their own CUDA
# libraries (nvidia-* wheels); the driver comes from the host. A CUDA cell pinned to
# Python 3.11 builds FROM the python image instead. NPU: Ascend's CANN image with the
# CANN that torch_npu's compatibility table pairs with the cell's torch_npu (npu.py).
# Digests are the multi-arch index digests of the tags (`docker buildx imagetools
# inspect NAME` prints them); a runner that mirrors images overrides them (BASE_VARS).
PUBLIC_BASES: dict[tuple[str, str], PublicBase] = {
    ("cpu", "3.11"): PublicBase(
        "python:3.11-bookworm", "sha256:a8f8fbe1a0edc9e4dddafa64ba73f7e04be7be5ebc23f332362e779e0a2e4e52",
        "Debian bookworm + CPython 3.11 with gcc/g++ and headers"),
    ("cuda", "3.12"): PublicBase(
        "nvidia/cuda:13.0.1-runtime-ubuntu24.04",
        "sha256:c3fde347d52d578c84fd644bc177bc7ec333feaf11550d990da4084d7612e4c7",
        "NVIDIA's CUDA 13.0 runtime on Ubuntu 24.04; Python 3.12 and gcc added once (prepare)",
        prepare=("python3", "python3-venv", "python3-dev", "gcc", "g++", "ca-certificates")),
    ("cuda", "3.11"): PublicBase(
        "python:3.11-bookworm", "sha256:a8f8fbe1a0edc9e4dddafa64ba73f7e04be7be5ebc23f332362e779e0a2e4e52",
        "CPython 3.11 + gcc; CUDA runtime from the torch wheels, driver from the host"),
    ("npu", "3.11"): PublicBase(
        "ascendai/cann:9.2.0-910b-ubuntu22.04-py3.11", None,
        "CANN 9.2.0 (torch_npu 2.13.0 / 2.14.0); set DISTCI_NPU_BASE_IMAGE to a digest-pinned ref"),
}
BASE_VARS = {"cpu": ("DISTCI_CPU_BASE_IMAGE", "DISTCI_BASE_IMAGE"),
             "cuda": ("DISTCI_CUDA_BASE_IMAGE", "DISTCI_BASE_IMAGE"),
             "npu": ("DISTCI_NPU_BASE_IMAGE",)}


def connect(timeout: int = BUILD_TIMEOUT_S):
    """A Docker SDK client for the daemon DOCKER_HOST names (or the default socket).

    Raises InfraError with one line saying what to do when the SDK is missing or the
    daemon does not answer.
    """
    try:
        import docker
    except ImportError:
        raise InfraError("the Docker SDK is not installed: pip install 'distci[docker]'") from None
    where = os.environ.get("DOCKER_HOST") or "the default socket"
    try:
        docker.from_env(timeout=15).ping()
        return docker.from_env(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - DockerException, or requests errors from a half-open socket
        reason = " ".join(str(exc).replace("Error while fetching server API version: ", "").split())[:160]
        raise InfraError(f"Docker daemon not reachable at {where} ({reason}); start dockerd or set DOCKER_HOST") \
            from None


def image_exists(client, ref: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        client.images.get(ref)
    except ImageNotFound:
        return False
    return True



def public_base(family: str, python: str) -> PublicBase:
    try:
        return PUBLIC_BASES[(family, python)]
    except KeyError:
        known = ", ".join(f"{f}/py{p}" for f, p in PUBLIC_BASES)
        raise ConfigError(f"no public base image for the {family} family with Python {python} (known: {known}); "
                          f"set {BASE_VARS[family][0]} to one") from None


def configured_base(family: str) -> str | None:
    """The runner's override (DISTCI_<FAMILY>_BASE_IMAGE, then DISTCI_BASE_IMAGE), if any."""
    for var in BASE_VARS[family]:
        if os.environ.get(var, "").strip():
            return os.environ[var].strip()
    return None


def resolve_base(family: str, python: str, client, *, log: Log = print) -> str:
    """The image reference the family's Dockerfile builds FROM on this runner.

    `local` makes (once) the debootstrap base and tags it under the public name, so the
    rest of the build cannot tell it from the pulled image.
    """
    chosen = configured_base(family)
    if chosen and chosen != LOCAL:
        return chosen
    public = public_base(family, python)
    if chosen != LOCAL:
        return ensure_prepared(client, public.ref, public.prepare, log=log) if public.prepare else public.ref
    if family == "npu":
        raise ConfigError("DISTCI_NPU_BASE_IMAGE=local: there is no air-gapped CANN base; "
                          "load Ascend's CANN image into the daemon and name it")
    made = ensure_local_base(client, log=log)
    image = client.images.get(made)
    repository, _, tag = public.name.rpartition(":")
    if public.name not in (image.tags or []):
        image.tag(repository, tag)
    return ensure_prepared(client, public.name, public.prepare, log=log) if public.prepare else public.name


PREPARE_RECIPE = DOCKER_DIR / "base" / "prepare.Dockerfile"


def prepared_tag(base: str, packages: tuple[str, ...]) -> str:
    """The tag of `base` with `packages` added: changes with the base, the list and the recipe."""
    import hashlib

    key = "\n".join([base, " ".join(packages), sha256_file(PREPARE_RECIPE)])
    return f"distci/base-prepared:{hashlib.sha256(key.encode()).hexdigest()[:INPUTS_LENGTH]}"


def ensure_prepared(client, base: str, packages: tuple[str, ...], *, log: Log = print) -> str:
    """`base` with the packages a cell build needs, built once per runner (the only build
    step with network: apt-get from the base's own distribution; skipped when the base
    already has Python with venv and headers and gcc). Returns the tag to build FROM."""
    tag = prepared_tag(base, packages)
    if client is None or image_exists(client, tag):
        return tag
    from docker.errors import APIError, BuildError, DockerException

    log(f"base image {base}: adding {' '.join(packages)} once for this runner -> {tag}")
    started = time.monotonic()
    try:
        client.images.build(path=str(PREPARE_RECIPE.parent), dockerfile=PREPARE_RECIPE.name, tag=tag, rm=True,
                            forcerm=True, buildargs={"BASE_IMAGE": base, "PACKAGES": " ".join(packages)})
    except BuildError as exc:
        tail = "\n".join(str(item.get("stream") or item.get("error") or "").rstrip() for item in exc.build_log)[-3000:]
        raise InfraError(f"preparing base image {base} failed ({exc.msg}); it needs the base pullable and its "
                         f"distribution's package mirror reachable once, or set a base that has python3 + gcc",
                         log=tail) from None
    except (APIError, DockerException) as exc:
        raise InfraError(f"preparing base image {base} failed: {' '.join(str(exc).split())[:300]}") from None
    log(f"base image {tag}: ready in {time.monotonic() - started:.0f}s")
    return tag


def local_base_tag() -> str:
    """The tag of the debootstrap base this checkout's recipe makes (changes with the recipe)."""
    return f"distci/base:bookworm-{sha256_file(BASE_RECIPE)[:INPUTS_LENGTH]}"


def ensure_local_base(client, *, log: Log = print) -> str:
    """Make the local base image once per machine (debootstrap + docker import); return its tag."""
    tag = local_base_tag()
    if image_exists(client, tag):
        return tag
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        raise InfraError(f"base image {tag} is missing and cannot be made by this user (debootstrap needs root, "
                         f"once per machine): run `sudo {BASE_RECIPE.relative_to(REPO)} {tag}`, or unset "
                         f"DISTCI_BASE_IMAGE to build FROM the public base")
    IMAGES_DIR.mkdir(parents=True, exist_ok=True)
    log_path = IMAGES_DIR / "make-base.log"
    log(f"base image {tag}: making it once for this machine (debootstrap + docker import, a few minutes); "
        f"log: {log_path}")
    started = time.monotonic()
    with log_path.open("w") as out:
        proc = subprocess.run(["bash", str(BASE_RECIPE), tag], stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not image_exists(client, tag):
        tail = "\n".join(log_path.read_text().splitlines()[-30:])
        raise InfraError(f"making base image {tag} failed (exit {proc.returncode}; log: {log_path})", log=tail)
    log(f"base image {tag}: ready in {time.monotonic() - started:.0f}s")
    return tag
