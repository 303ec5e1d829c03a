"""The daemon connection and the base images cell images build FROM.

By default a family builds FROM a maintained public image, pinned by digest in
docker/bases.toml (`PUBLIC_BASES`, the one declaration of them; docs/runners.md's
pre-pull table shows the same file), so a self-hosted runner needs nothing but Docker
and the docker group. A base the file gives no digest is refused at build time, with
the command that pins it, unless the runner names a base of its own or opts out
(DISTCI_ALLOW_UNPINNED_BASE=1): an unpinned tag builds from whatever it points at today.
A runner overrides the base with DISTCI_<FAMILY>_BASE_IMAGE or DISTCI_BASE_IMAGE (any
image with python3 + venv + headers and gcc). The value `local` selects the air-gapped
fallback: a Debian base made once per machine by docker/base/make-base.sh (debootstrap +
docker import, no registry) under a distci-owned tag, never under the public name: the
daemon is shared, and another team's `FROM python:3.11-bookworm` must keep getting
Python's image. This is what distci's own tests use, since nothing can be pulled there.
"""

from __future__ import annotations

import functools

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from distci import tomlloc
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


BASES_FILE = DOCKER_DIR / "bases.toml"
UNPINNED_OPT_OUT = "DISTCI_ALLOW_UNPINNED_BASE"


@dataclass(frozen=True)
class PublicBase:
    """A maintained public image a family builds FROM, for one Python (an entry of docker/bases.toml)."""

    name: str            # repository:tag, what the daemon pulls
    digest: str | None   # sha256:..., the pin; None where no digest has been verified
    why: str
    prepare: tuple[str, ...] = ()
    """Distribution packages the image lacks for a cell build (NVIDIA's CUDA runtime images
    have no Python and no compiler): added once per runner and base by a networked build of
    docker/base/prepare.Dockerfile (ensure_prepared); the cell build stays offline."""

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.digest}" if self.digest else self.name


BASE_KEYS = {"family": str, "python": str, "image": str, "digest": str, "why": str, "prepare": list}
REQUIRED_BASE_KEYS = ("family", "python", "image", "why")


def load_bases(path: Path = BASES_FILE) -> dict[tuple[str, str], PublicBase]:
    """docker/bases.toml as (family, python) -> PublicBase; a bad entry is a ConfigError at its file:line."""
    data, locator = tomlloc.read(path, kind=ConfigError, max_bytes=64_000,
                                 missing="it is part of distci's checkout (docker/bases.toml)")
    bases: dict[tuple[str, str], PublicBase] = {}
    entries = data.get("base")
    if set(data) - {"base"} or not isinstance(entries, list) or not entries:
        raise ConfigError("expected only [[base]] entries", where=str(path))
    for i, entry in enumerate(entries):
        def bad(message: str, key: str | None = None) -> ConfigError:
            return ConfigError(f"[[base]] #{i + 1}: {message}", where=locator.where(locator.entry_line("base", i, key)))

        for key, value in entry.items():
            if key not in BASE_KEYS:
                raise bad(f"unknown key {key!r}{tomlloc.suggest(key, BASE_KEYS)}", key)
            if not isinstance(value, BASE_KEYS[key]) or (key == "prepare" and not all(isinstance(p, str) for p in value)):
                raise bad(f"{key} must be a {BASE_KEYS[key].__name__}" + (" of strings" if key == "prepare" else ""), key)
        missing = [k for k in REQUIRED_BASE_KEYS if k not in entry]
        if missing:
            raise bad(f"missing {', '.join(missing)}")
        if entry["family"] not in FAMILIES:
            raise bad(f"family {entry['family']!r} is not one of {', '.join(FAMILIES)}", "family")
        if "digest" in entry and not re.fullmatch(r"sha256:[0-9a-f]{64}", entry["digest"]):
            raise bad(f"digest {entry['digest']!r} is not sha256:<64 hex digits> (leave it out where none is known)",
                      "digest")
        key = (entry["family"], entry["python"])
        if key in bases:
            raise bad(f"a second base for {key[0]} with Python {key[1]}", "python")
        bases[key] = PublicBase(entry["image"], entry.get("digest"), entry["why"], tuple(entry.get("prepare", ())))
    return bases


@functools.cache
def public_bases() -> dict[tuple[str, str], PublicBase]:
    """docker/bases.toml, read on first use (`PUBLIC_BASES`): not at import, so an installed
    controller without a checkout's docker/ still starts and prints every command's --help
    (tests/test_installed_cli.py); building an image needs the checkout's docker/ anyway."""
    return load_bases()


def __getattr__(name: str):  # PEP 562: `PUBLIC_BASES` keeps its name, loaded when first read
    if name == "PUBLIC_BASES":
        return public_bases()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
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
        return public_bases()[(family, python)]
    except KeyError:
        known = ", ".join(f"{f}/py{p}" for f, p in public_bases())
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

    `local` makes (once) the debootstrap base and builds FROM its own tag
    (`distci/base:bookworm-<recipe hash>`); a public name an older distci gave it on this
    daemon is taken back (public_alias_dropped).
    """
    chosen = configured_base(family)
    if chosen and chosen != LOCAL:
        return chosen
    public = public_base(family, python)
    if chosen != LOCAL:
        check_pinned(family, public)
        return ensure_prepared(client, public.ref, public.prepare, log=log) if public.prepare else public.ref
    if family == "npu":
        raise ConfigError("DISTCI_NPU_BASE_IMAGE=local: there is no air-gapped CANN base; "
                          "load Ascend's CANN image into the daemon and name it")
    made = ensure_local_base(client, log=log)
    if public_alias_dropped(client, public.name, made):
        log(f"base image {public.name}: untagged on this daemon (an older distci had given that name to {made}; "
            f"`docker pull {public.ref}` brings Python's image back)")
    return ensure_prepared(client, made, public.prepare, log=log) if public.prepare else made


def check_pinned(family: str, base: PublicBase) -> None:
    """A public base with no digest in docker/bases.toml is refused (one line: the command that
    pins it, and the opt-out), unless DISTCI_ALLOW_UNPINNED_BASE=1: a tag alone builds from
    whatever the registry serves that day, so two nights of one cell could differ unseen."""
    if base.digest or os.environ.get(UNPINNED_OPT_OUT, "").strip() == "1":
        return
    repository = base.name.rsplit(":", 1)[0]
    raise ConfigError(f"base image {base.name} is not pinned by digest (docker/bases.toml has none): print its "
                      f"digest with `docker buildx imagetools inspect {base.name}` (or `crane digest {base.name}`) "
                      f"and set {BASE_VARS[family][0]}={repository}@sha256:<digest>, or set {UNPINNED_OPT_OUT}=1 "
                      f"to build FROM the tag as it is")


def public_alias_dropped(client, public_name: str, local_tag: str) -> bool:
    """Remove `public_name` from this daemon when it names the local base (what distci did
    before its tag was private); True when it did. A pulled image of that name is left alone."""
    if client is None or not image_exists(client, public_name) or not image_exists(client, local_tag):
        return False
    if client.images.get(public_name).id != client.images.get(local_tag).id:
        return False
    client.images.remove(public_name, noprune=True)  # the image keeps its distci tag: only the name goes
    return True


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
