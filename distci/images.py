"""Cell images: render a build context, build it with the Docker SDK, run the suites in it.

A cell's image is content-addressed: its tag is ``distci/<family>:<cell-id>-<inputs>``
where `inputs` hashes everything that goes into it (the family's Dockerfile directory,
the base image, the wheelhouse key, distci's and the fix package's sources, the suites,
the optional proxy files). An existing tag is never rebuilt, and the tag is known
before anything is downloaded, so a warm runner decides in milliseconds.

The build context is rendered into a temporary directory: the Dockerfile, the
wheelhouse split into two hash-pinned locks (the torch stack, then torchao/torchtitan),
distci's own wheels, the suites and the proxy files, and streamed to the daemon as a
tar. The build itself runs with no network (``network_mode="none"``): everything comes
from the context. Only the legacy builder is assumed (no BuildKit, no ``RUN --mount``).

Running: a cell's pytest command (the same as a venv run, from distci.cellrun) runs in a
container of its image, with the run directory mounted, so results.jsonl, junit.xml
and stack.json land where a venv run puts them. The image id goes into the stack
(``DISTCI_IMAGE_DIGEST``) and run.json. Device access per family is `PROFILES`.
Without a reachable daemon every selected cell gets an `infra` result, never a traceback.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Iterator

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .cellrun import (
    HARNESS_REQUIREMENTS,
    absent_accelerator_run,
    CellRun,
    cell_environment,
    finish_run,
    infra_run,
    pytest_command,
    stack_inputs,
    start_run,
)
from .errors import ConfigError, InfraError, SourceError
from .matrix import Cell
from .selfwheels import REPO, SOURCES, build_all, source_hash
from .wheelhouse import Wheelhouse, ensure_wheelhouse, interpreter_tags, sha256_file, wheelhouse_key

Log = Callable[[str], None]

FAMILIES = ("cpu", "cuda", "npu")
DOCKER_DIR = REPO / "docker"
BASE_RECIPE = DOCKER_DIR / "base" / "make-base.sh"
IMAGES_DIR = Path(".distci") / "images"
WORKDIR = PurePosixPath("/distci")
IMAGE_PYTHON = PurePosixPath("/venv/bin/python")
# The torch-stack layer holds these and everything they need; the rest of the
# wheelhouse (torchao, torchtitan and their own dependencies) is the layer above.
STACK_ROOTS = ("torch", "torch-npu", *HARNESS_REQUIREMENTS)
INPUTS_LENGTH = 12
MAX_TAG = 128
CONTAINER_FILE = "container.json"
BUILD_TIMEOUT_S = 3600

# Base image overrides, per family; unset means: cpu/cuda the local debootstrap base,
# npu the Dockerfile's default (a CANN image).
BASE_VARS = {"cpu": ("DISTCI_BASE_IMAGE",), "cuda": ("DISTCI_CUDA_BASE_IMAGE", "DISTCI_BASE_IMAGE"),
             "npu": ("DISTCI_NPU_BASE_IMAGE",)}
PROXY_FILES = {"DISTCI_CA_BUNDLE": "ca-bundle.crt", "DISTCI_PIP_CONF": "pip.conf"}

# Ascend's compatibility table (torch_npu package version -> CANN), from the
# Ascend/pytorch README; torch_npu X.Y.Z[.postN] always pairs with torch X.Y.Z.
CANN_FOR_TORCH_NPU = {
    "2.12.0.post2": "9.1.X", "2.11.0.post2": "9.1.X", "2.10.0.post6": "9.1.X", "2.9.0.post8": "9.1.X",
    "2.7.1.post10": "9.1.X", "2.12.0": "9.1.0", "2.11.0": "9.1.0", "2.10.0.post4": "9.1.0",
    "2.9.0.post6": "9.1.0", "2.7.1.post8": "9.1.0", "2.10.0": "9.0.0", "2.9.0.post2": "9.0.0",
    "2.8.0.post4": "9.0.0", "2.7.1.post4": "9.0.0", "2.9.0": "8.5.0", "2.8.0.post2": "8.5.0",
    "2.7.1.post2": "8.5.0", "2.6.0.post5": "8.5.0", "2.8.0": "8.3.RC1", "2.7.1": "8.3.RC1",
    "2.6.0.post3": "8.3.RC1", "2.6.0": "8.2.RC1", "2.5.1.post1": "8.2.RC1", "2.5.1": "8.1.RC1",
}


# --------------------------------------------------------------------------- daemon


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


# --------------------------------------------------------------------------- base image


def local_base_tag() -> str:
    """The tag of the debootstrap base this checkout's recipe makes (changes with the recipe)."""
    return f"distci/base:bookworm-{sha256_file(BASE_RECIPE)[:INPUTS_LENGTH]}"


def ensure_local_base(client, *, log: Log = print) -> str:
    """Make the local base image once per machine (debootstrap + docker import); return its tag."""
    tag = local_base_tag()
    if image_exists(client, tag):
        return tag
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        raise InfraError(f"base image {tag} is missing and cannot be made here (needs root and debootstrap); "
                         f"run `sudo {BASE_RECIPE.relative_to(REPO)} {tag}` or set DISTCI_BASE_IMAGE")
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


def configured_base(family: str) -> str | None:
    for var in BASE_VARS[family]:
        if os.environ.get(var, "").strip():
            return os.environ[var].strip()
    return None


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class ImagePlan:
    """What a cell's image is made of, known before anything is downloaded or built."""

    cell: Cell
    family: str
    tag: str
    inputs_hash: str
    base_image: str | None
    requirements: list[str]
    pip_args: list[str]
    python: str
    inputs: dict[str, Any]


def image_tag(family: str, cell_id: str, inputs_hash: str) -> str:
    """``distci/<family>:<cell-id>-<inputs>``; a cell id too long for a tag is shortened, the hash kept."""
    room = MAX_TAG - len(inputs_hash) - 1
    name = cell_id if len(cell_id) <= room else cell_id[: room - 9] + "-" + hashlib.sha256(cell_id.encode()).hexdigest()[:8]
    return f"distci/{family}:{name}-{inputs_hash}"


def _family(cell: Cell) -> str:
    family = cell.family or cell.accelerator
    if family not in FAMILIES or not (DOCKER_DIR / family / "Dockerfile").is_file():
        raise ConfigError(f"cell {cell.id}: no docker/{family}/Dockerfile (families: {', '.join(FAMILIES)})")
    return family


def _proxy_inputs() -> dict[str, str]:
    found = {}
    for var, name in PROXY_FILES.items():
        value = os.environ.get(var, "").strip()
        if not value:
            continue
        path = Path(value).expanduser()
        if not path.is_file():
            raise ConfigError(f"{var}={value} is not a file")
        found[name] = sha256_file(path)
    return found


def _check_target(cell: Cell, tags: dict[str, str], python: str) -> None:
    """The wheelhouse is built by `python` on this host: it must match the image's Python and arch."""
    wanted = "cpython" + cell.python.replace(".", "")
    if tags["python"] != wanted:
        raise ConfigError(f"cell {cell.id} needs Python {cell.python} wheels, but {python} is {tags['python']}; "
                          f"set DISTCI_IMAGE_PYTHON to a Python {cell.python} interpreter")
    if not tags["platform"].endswith(cell.arch):
        raise ConfigError(f"cell {cell.id} is for {cell.arch}, but this host builds {tags['platform']} wheels; "
                          f"build its image on a {cell.arch} runner")


def plan_image(cell: Cell, client, *, log: Log = print) -> ImagePlan:
    """Resolve a cell's stack and hash every input of its image into its tag."""
    family = _family(cell)
    python = os.environ.get("DISTCI_IMAGE_PYTHON") or sys.executable
    tags = interpreter_tags(python)
    _check_target(cell, tags, python)
    _, requirements, pip_args = stack_inputs(cell, python=python)
    base = configured_base(family)
    if base is None and family != "npu":
        base = ensure_local_base(client, log=log)
    base_id = client.images.get(base).id if base and image_exists(client, base) else None
    inputs = {
        "schema": 1,
        "family": family,
        "docker": source_hash(DOCKER_DIR, (family,)),
        "base": base or "dockerfile-default",
        "base_id": base_id,
        "python": cell.python,
        "wheelhouse": wheelhouse_key(requirements, pip_args, tags),
        "own": {name: source_hash(root, parts) for name, (root, parts) in SOURCES.items()
                if (root / "pyproject.toml").exists()},
        "suites": source_hash(REPO, ("suites",)),
        "proxy": _proxy_inputs(),
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:INPUTS_LENGTH]
    return ImagePlan(cell=cell, family=family, tag=image_tag(family, cell.id, digest), inputs_hash=digest,
                     base_image=base, requirements=requirements, pip_args=pip_args, python=python, inputs=inputs)


# --------------------------------------------------------------------------- context


def _wheel_requires(path: Path) -> list[Requirement]:
    with zipfile.ZipFile(path) as zf:
        name = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        text = zf.read(name).decode("utf-8", "replace") if name else ""
    found = []
    for line in text.splitlines():
        if not line.strip():
            break
        if line.startswith("Requires-Dist:"):
            try:
                found.append(Requirement(line.split(":", 1)[1].strip()))
            except InvalidRequirement:
                continue
    return found


def split_stack(wheelhouse: Wheelhouse, roots: Iterable[str] = STACK_ROOTS) -> tuple[list[dict], list[dict]]:
    """The wheelhouse's wheels as (torch stack, the rest): the closure of `roots`, then what is left.

    Dependencies come from each wheel's METADATA with markers evaluated for this
    interpreter (the wheelhouse was built for it) and requested extras followed (torch
    asks for ``cuda-toolkit[cublas,...]``), so each lock is complete on its own.
    """
    wheels = {canonicalize_name(w["name"]): w for w in wheelhouse.manifest["wheels"]}
    env = default_environment()
    wanted: dict[str, set[str]] = {}
    todo = [(canonicalize_name(r), frozenset()) for r in roots if canonicalize_name(r) in wheels]
    while todo:
        name, extras = todo.pop()
        seen = wanted.get(name)
        if seen is not None and extras <= seen:
            continue
        wanted[name] = (seen or set()) | extras
        for req in _wheel_requires(wheelhouse.path / wheels[name]["filename"]):
            active = req.marker is None or any(req.marker.evaluate({**env, "extra": e})
                                               for e in ("", *sorted(wanted[name])))
            dep = canonicalize_name(req.name)
            if active and dep in wheels:
                todo.append((dep, frozenset(canonicalize_name(e) for e in req.extras)))
    stack = [w for n, w in sorted(wheels.items()) if n in wanted]
    rest = [w for n, w in sorted(wheels.items()) if n not in wanted]
    return stack, rest


def _lock_line(name: str, version: str, sha256: str) -> str:
    return f"{canonicalize_name(name)}=={version} --hash=sha256:{sha256}\n"


def _link(src: Path, dest: Path) -> None:
    """Hard-link when possible (a multi-GB CUDA wheelhouse costs nothing to render), else copy."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _write_wheels(directory: Path, source_dir: Path, wheels: list[dict]) -> None:
    directory.mkdir(parents=True)
    for w in wheels:
        _link(source_dir / w["filename"], directory / w["filename"])
    (directory / "requirements.lock").write_text("".join(_lock_line(w["name"], w["version"], w["sha256"])
                                                         for w in wheels))


def _own_entry(wheel: Path) -> dict:
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return {"filename": wheel.name, "name": str(name), "version": str(version), "sha256": sha256_file(wheel)}


def render_context(plan: ImagePlan, wheelhouse: Wheelhouse, own_wheels: list[Path], dest: Path,
                   *, touch_fixes: str | None = None) -> dict[str, list[str]]:
    """Write the build context of `plan` into `dest`; return the wheels of each layer.

    `touch_fixes` adds a file to the fix-package layer, as an edit of fixes/ would (the
    bench and the layer-reuse test use it without touching the checkout).
    """
    shutil.copytree(DOCKER_DIR / plan.family, dest, ignore=shutil.ignore_patterns("*.md", "__pycache__"))
    stack, rest = split_stack(wheelhouse)
    _write_wheels(dest / "wheels" / "stack", wheelhouse.path, stack)
    _write_wheels(dest / "wheels" / "top", wheelhouse.path, rest)
    by_name = {canonicalize_name(_own_entry(w)["name"]): w for w in own_wheels}
    for layer, name in (("distci", "distci"), ("fixes", "distci-fixes")):
        wheel = by_name.get(canonicalize_name(name))
        entries = [_own_entry(wheel)] if wheel else []
        _write_wheels(dest / "own" / layer, wheel.parent if wheel else dest, entries)
    if touch_fixes:
        (dest / "own" / "fixes" / "touched").write_text(touch_fixes + "\n")
    shutil.copytree(REPO / "suites", dest / "suites", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    proxy = dest / "proxy"
    proxy.mkdir()
    for var, name in PROXY_FILES.items():
        value = os.environ.get(var, "").strip()
        if value:
            shutil.copyfile(Path(value).expanduser(), proxy / name)
        else:
            (proxy / name).write_text("")
    return {"stack": [w["filename"] for w in stack], "top": [w["filename"] for w in rest]}


def _release(version: str) -> tuple[int, ...]:
    try:
        return Version(version).release[:3]
    except InvalidVersion:
        return ()


def check_npu_pairing(stack: list[dict]) -> str | None:
    """torch_npu X.Y.Z[.postN] needs torch X.Y.Z (Ascend's table); returns the CANN it pairs with, if known."""
    versions = {canonicalize_name(w["name"]): w["version"] for w in stack}
    torch, npu = versions.get("torch"), versions.get("torch-npu")
    if npu is None:
        raise ConfigError("an npu image needs torch_npu in its stack; set torch_npu in matrix.toml")
    if torch is None or _release(torch) != _release(npu):
        raise ConfigError(f"torch_npu {npu} pairs with torch {'.'.join(map(str, _release(npu)))}, "
                          f"not torch {torch} (Ascend's compatibility table); fix the cell's torch or torch_npu")
    return CANN_FOR_TORCH_NPU.get(Version(npu).public)


def stack_label(wheelhouse: Wheelhouse, own_wheels: list[Path]) -> dict[str, str]:
    """The exact versions an image carries, for its `distci.stack` label."""
    wanted = {"torch", "torchao", "torchtitan", "torch-npu", "triton", "numpy", "pytest", "distci", "distci-fixes"}
    entries = list(wheelhouse.manifest["wheels"]) + [_own_entry(w) for w in own_wheels]
    return {canonicalize_name(w["name"]): w["version"] for w in entries if canonicalize_name(w["name"]) in wanted}


# --------------------------------------------------------------------------- build


@dataclass
class BuiltImage:
    tag: str
    id: str
    built: bool
    seconds: float = 0.0
    log_path: Path | None = None
    steps: int = 0
    cached_steps: list[int] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")


class BuildDisplay:
    """The build log as a progress bar on a terminal, as one line per step elsewhere (CI logs)."""

    def __init__(self, title: str, log: Log, *, console=None) -> None:
        from rich.console import Console

        self.title = title
        self.log = log
        self.console = console or Console(stderr=True)
        self.progress = None
        self.task = None
        self.step = 0
        self.cached: list[int] = []

    def __enter__(self) -> "BuildDisplay":
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, \
                TimeElapsedColumn

            self.progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[title]}"), BarColumn(),
                                     MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
                                     console=self.console, transient=False)
            self.progress.start()
            self.task = self.progress.add_task("", total=None, title=self.title)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def feed(self, line: str) -> None:
        match = _STEP.match(line)
        if match:
            self.step, total, what = int(match.group(1)), int(match.group(2)), match.group(3)
            if self.progress is not None:
                self.progress.update(self.task, completed=self.step - 1, total=total, description=what[:70])
            else:
                self.log(f"  step {self.step}/{total}: {what[:110]}")
        elif "Using cache" in line:
            self.cached.append(self.step)
        elif self.progress is not None and line.strip():
            self.progress.update(self.task, description=line.strip()[:70])

    def done(self) -> None:
        if self.progress is not None and self.task is not None:
            total = self.progress.tasks[0].total
            self.progress.update(self.task, completed=total, description="done")


def _stream_lines(chunks: Iterable[dict]) -> Iterator[tuple[str, str | None]]:
    """(line, error) pairs from the daemon's decoded build stream."""
    pending = ""
    for chunk in chunks:
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail") or {}
            yield "", str(chunk.get("error") or detail.get("message") or chunk)
            continue
        text = chunk.get("stream") or chunk.get("status") or ""
        pending += text
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line.rstrip("\r"), None
    if pending:
        yield pending, None


def tar_stream(path: Path, chunk: int = 1 << 20) -> Iterator[bytes]:
    """The build context as a tar stream, made while it is sent.

    docker-py would first write the whole tar to a temporary file: for a CUDA stack that
    is gigabytes of disk and a minute before the daemon sees a byte.
    """
    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def write() -> None:
        try:
            with os.fdopen(write_fd, "wb") as out, tarfile.open(fileobj=out, mode="w|") as tar:
                for entry in sorted(path.rglob("*")):
                    tar.add(entry, arcname=str(entry.relative_to(path)), recursive=False)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the reading thread
            failure.append(exc)

    writer = threading.Thread(target=write, name="distci-context-tar", daemon=True)
    writer.start()
    with os.fdopen(read_fd, "rb") as source:
        while block := source.read(chunk):
            yield block
    writer.join()
    if failure and not isinstance(failure[0], BrokenPipeError):
        raise InfraError(f"could not send the build context {path}: {failure[0]}")


def build_context(client, context: Path, tag: str, *, buildargs: dict[str, str], log_path: Path,
                  nocache: bool = False, log: Log = print) -> BuiltImage:
    """Build a rendered context with the daemon (legacy builder, no network); stream the log."""
    from docker.errors import APIError, DockerException

    started = time.monotonic()
    error = None
    lines: list[str] = []
    log_path.parent.mkdir(parents=True, exist_ok=True)
    title = tag if len(tag) <= 40 else "…" + tag[-39:]
    with log_path.open("w") as out, BuildDisplay(title, log) as display:
        try:
            stream = client.api.build(fileobj=tar_stream(context), custom_context=True, tag=tag,
                                      buildargs=buildargs, network_mode="none",
                                      rm=True, forcerm=True, nocache=nocache, decode=True, pull=False)
            for line, err in _stream_lines(stream):
                if err:
                    error = err
                    out.write(f"ERROR: {err}\n")
                    continue
                out.write(line + "\n")
                lines.append(line)
                display.feed(line)
        except (APIError, DockerException, OSError) as exc:
            error = " ".join(str(exc).split())
        display.done()
    if error:
        raise InfraError(f"image build of {tag} failed: {error[-300:]} (log: {log_path})",
                         log="\n".join(lines[-40:] + [error]))
    image = client.images.get(tag)
    return BuiltImage(tag=tag, id=image.id, built=True, seconds=time.monotonic() - started, log_path=log_path,
                      steps=display.step, cached_steps=display.cached, labels=dict(image.labels or {}))


def ensure_image(cell: Cell, client, *, force: bool = False, nocache: bool = False, touch_fixes: str | None = None,
                 tag: str | None = None, log: Log = print) -> BuiltImage:
    """The cell's image: reused when its tag exists, else built from a freshly rendered context.

    `tag` overrides the content-addressed tag (for builds whose context was altered with
    `touch_fixes`, which must never take the real tag).
    """
    plan = plan_image(cell, client, log=log)
    ref = tag or plan.tag
    if not force and image_exists(client, ref):
        image = client.images.get(ref)
        log(f"[{cell.id}] image {ref}: exists, not rebuilt")
        return BuiltImage(tag=ref, id=image.id, built=False, labels=dict(image.labels or {}))
    prefix = f"[{cell.id}] "
    wheelhouse = ensure_wheelhouse(plan.requirements, plan.pip_args, python=plan.python,
                                   log=lambda m: log(prefix + m))
    own = build_all(Path(".distci") / "selfwheels", log=lambda m: log(prefix + m))
    cann = check_npu_pairing(split_stack(wheelhouse)[0]) if plan.family == "npu" else None
    IMAGES_DIR.mkdir(parents=True, exist_ok=True)
    context = Path(tempfile.mkdtemp(prefix=f"context-{plan.family}-", dir=IMAGES_DIR)) / "context"
    try:
        layers = render_context(plan, wheelhouse, own, context, touch_fixes=touch_fixes)
        buildargs = {
            "DISTCI_CELL": cell.id,
            "DISTCI_INPUTS": plan.inputs_hash,
            "DISTCI_STACK": json.dumps(stack_label(wheelhouse, own), sort_keys=True, separators=(",", ":")),
            "PYTHON_VERSION": cell.python,
        }
        if plan.base_image:
            buildargs["BASE_IMAGE"] = plan.base_image
        if plan.family == "npu":
            buildargs["DISTCI_CANN"] = cann or "unknown"
        log(f"{prefix}image {ref}: building ({len(layers['stack'])} stack wheels, {len(layers['top'])} above)")
        built = build_context(client, context, ref, buildargs=buildargs, nocache=nocache, log=log,
                              log_path=IMAGES_DIR / "logs" / f"{ref.replace('/', '_').replace(':', '_')}.log")
    finally:
        shutil.rmtree(context.parent, ignore_errors=True)
    log(f"{prefix}image {ref}: built in {built.seconds:.1f}s, {len(built.cached_steps)}/{built.steps} steps cached")
    return built


# --------------------------------------------------------------------------- run


@dataclass(frozen=True)
class RunProfile:
    """How a family's container reaches its devices (and nothing else)."""

    network_mode: str
    ipc_mode: str | None = None
    shm_size: str | None = None
    cap_add: tuple[str, ...] = ()
    memlock_unlimited: bool = False
    gpus: bool = False
    devices: tuple[str, ...] = ()
    required_device: str | None = None
    mounts: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


PROFILES = {
    # No network at all: gloo rendezvous runs over loopback. SYS_PTRACE lets py-spy dump
    # the stacks of hung ranks.
    "cpu": RunProfile(network_mode="none", shm_size="2g", cap_add=("SYS_PTRACE",),
                      env=(("GLOO_SOCKET_IFNAME", "lo"),)),
    # Async TP (symmetric memory) and NCCL need host IPC and pinned memory; py-spy needs ptrace.
    "cuda": RunProfile(network_mode="host", ipc_mode="host", cap_add=("SYS_PTRACE",), memlock_unlimited=True,
                       gpus=True),
    # The devices and driver mounts Ascend documents for running CANN in a container.
    "npu": RunProfile(network_mode="host", ipc_mode="host", cap_add=("SYS_PTRACE",), memlock_unlimited=True,
                      devices=("/dev/davinci[0-9]*", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"),
                      required_device="/dev/davinci[0-9]*",
                      mounts=("/usr/local/Ascend/driver", "/usr/local/dcmi", "/usr/local/bin/npu-smi",
                              "/etc/ascend_install.info")),
}


def container_options(family: str) -> dict[str, Any]:
    """containers.run() keyword arguments for a family; InfraError when its devices are absent here."""
    from docker.types import DeviceRequest, Ulimit

    profile = PROFILES[family]
    if profile.required_device and not glob.glob(profile.required_device):
        raise InfraError(f"no {profile.required_device} device on this runner: a {family} cell cannot run here")
    options: dict[str, Any] = {"network_mode": profile.network_mode, "cap_add": list(profile.cap_add)}
    if profile.ipc_mode:
        options["ipc_mode"] = profile.ipc_mode
    if profile.shm_size:
        options["shm_size"] = profile.shm_size
    if profile.memlock_unlimited:
        options["ulimits"] = [Ulimit(name="memlock", soft=-1, hard=-1)]
    if profile.gpus:
        options["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    devices = sorted({d for pattern in profile.devices for d in glob.glob(pattern)})
    if devices:
        options["devices"] = [f"{d}:{d}:rwm" for d in devices]
    mounts = {p: {"bind": p, "mode": "ro"} for p in profile.mounts if os.path.exists(p)}
    if mounts:
        options["volumes"] = mounts
    return options


def checkout_mounts(tests: list[str]) -> dict[str, dict[str, str]]:
    """Test paths outside suites/ (an ad-hoc `--test tests/...`) are mounted read-only from the checkout."""
    mounts = {}
    for test in tests:
        top = PurePosixPath(test.split("::", 1)[0]).parts[0] if test else ""
        if top and top != "suites" and (REPO / top).exists():
            mounts[str(REPO / top)] = {"bind": str(WORKDIR / top), "mode": "ro"}
    return mounts


def _container_env(cell: Cell, tier: str | None, image: BuiltImage, family: str) -> dict[str, str]:
    env = {
        **cell_environment(cell, tier),
        **dict(PROFILES[family].env),
        "DISTCI_IMAGE_DIGEST": image.id,
        "DISTCI_IMAGE": image.tag,
        "DISTCI_RUNNER": os.environ.get("DISTCI_RUNNER") or socket.gethostname(),
        "PYTHONUNBUFFERED": "1",
    }
    if os.geteuid() != 0:
        env.update(HOME="/tmp", USER="distci")
    return env


def _record_container(run_dir: Path, container) -> None:
    container.reload()
    host = container.attrs.get("HostConfig", {})
    keep = ("NetworkMode", "IpcMode", "ShmSize", "CapAdd", "Devices", "DeviceRequests", "Ulimits", "Binds")
    (run_dir / CONTAINER_FILE).write_text(json.dumps({
        "id": container.id, "image": container.attrs.get("Config", {}).get("Image"),
        "image_id": container.attrs.get("Image"), "host_config": {k: host.get(k) for k in keep}},
        indent=1, sort_keys=True, default=str))


def run_cell_in_docker(cell: Cell, client, *, runs_root: Path, tests: list[str] | None = None,
                       keyword: str | None = None, tier: str | None = None, log: Log = print) -> CellRun:
    """One run of a cell in its container: the venv run's pytest command, results through a mount."""
    from docker.errors import DockerException

    info, run_dir = start_run(cell, runs_root, tier=tier, backend="docker", log=log)
    try:
        family = _family(cell)
        options = container_options(family)  # no device, no build
        image = ensure_image(cell, client, log=log)
    except (InfraError, SourceError, ConfigError) as exc:
        log(f"[{cell.id}] infra: {exc}")
        return infra_run(cell, info, run_dir, exc, None)
    info.image, info.image_digest = image.tag, image.id
    # The run directory is mounted at its own path, so paths the harness records (logs) hold outside too.
    cmd = pytest_command(cell, Path(IMAGE_PYTHON), run_dir, info.run_id, tests=tests or [],
                         keyword=keyword, extra_args=[], root=Path(WORKDIR))
    info.command = shlex.join(cmd)
    volumes = {**options.pop("volumes", {}), **checkout_mounts(tests or []),
               str(run_dir): {"bind": str(run_dir), "mode": "rw"}}
    user = None if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"
    log(f"[{cell.id}] $ docker run {image.tag} {info.command}")
    container = None
    try:
        container = client.containers.run(image.tag, cmd, detach=True, working_dir=str(WORKDIR), user=user,
                                          environment=_container_env(cell, tier, image, family), volumes=volumes,
                                          labels={"distci.run": info.run_id, "distci.cell": cell.id}, **options)
        _record_container(run_dir, container)
        with open(run_dir / "pytest.log", "w") as out:
            pending = b""
            for chunk in container.logs(stream=True, follow=True):
                pending += chunk
                *done, pending = pending.split(b"\n")
                for raw in done:
                    line = raw.decode("utf-8", "replace")
                    out.write(line + "\n")
                    log(f"[{cell.id}] {line}")
            if pending:
                out.write(pending.decode("utf-8", "replace") + "\n")
        code = container.wait().get("StatusCode")
    except DockerException as exc:
        error = InfraError(f"container of {image.tag} failed to run: {' '.join(str(exc).split())[:300]}")
        log(f"[{cell.id}] infra: {error}")
        return infra_run(cell, info, run_dir, error, None)
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except DockerException:
                pass
    return finish_run(cell, info, run_dir, code)


def run_cells_in_docker(cells: list[Cell], args: argparse.Namespace) -> list[CellRun]:
    """`python -m distci run --backend docker`: each cell's suites in its image."""
    runs_root = Path(args.runs_root)
    try:
        client = connect()
    except InfraError as exc:
        print(f"distci: infra: {exc}", file=sys.stderr, flush=True)
        runs = []
        for cell in cells:
            info, run_dir = start_run(cell, runs_root, tier=args.tier, backend="docker", log=lambda m: None)
            runs.append(infra_run(cell, info, run_dir, exc, None))
        return runs
    return [absent_accelerator_run(cell, runs_root, tier=args.tier, backend="docker")
            or run_cell_in_docker(cell, client, runs_root=runs_root, tests=args.test, keyword=args.k, tier=args.tier)
            for cell in cells]


# --------------------------------------------------------------------------- CLI + bench


def _cmd_images(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from .matrix import load_matrix

    matrix = load_matrix(args.matrix)
    cells = matrix.select(cell_ids=args.cell or None, tier=args.tier if not args.cell else None)
    client = connect()
    table = Table(title="distci images")
    for col in ("cell", "tag", "image id", "built", "time"):
        table.add_column(col, no_wrap=True)
    failed = 0
    for cell in cells:
        try:
            image = ensure_image(cell, client, force=args.force, nocache=args.no_cache)
        except (InfraError, SourceError, ConfigError) as exc:
            failed += 1
            print(f"distci: infra: {cell.id}: {exc}", file=sys.stderr)
            table.add_row(cell.id, "-", "-", "failed", "-", style="red")
            continue
        table.add_row(cell.id, image.tag, image.id[:19], "built" if image.built else "reused",
                      f"{image.seconds:.1f}s")
    Console(width=None if Console().is_terminal else 220).print(table)
    return 3 if failed else 0


def add_parser(sub) -> None:
    p = sub.add_parser("images", help="build the cells' images (docker/<family>/Dockerfile) with the Docker SDK")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--cell", action="append", help="cell id (repeatable, globs allowed)")
    which.add_argument("--tier", help="every cell of this tier")
    p.add_argument("--force", action="store_true", help="build even when the tag exists (the layer cache still applies)")
    p.add_argument("--no-cache", action="store_true", help="build without the layer cache")
    p.set_defaults(fn=_cmd_images)


WARM_GOAL_S = 15.0


def bench_images(cell_id: str | None = None, matrix_path: str = "matrix.toml", *, log: Log = print) -> dict[str, float]:
    """Cold build (no layer cache) vs warm build after an edit of fixes/; prints both and their ratio.

    The wheelhouse and distci's wheels are prepared first and not timed: this measures
    the image build alone. Both builds get throwaway tags, removed at the end.
    """
    from rich.console import Console
    from rich.table import Table

    from .matrix import load_matrix

    matrix = load_matrix(matrix_path)
    cell = matrix.cell(cell_id) if cell_id else next(c for c in matrix.select(tier="pr") if c.accelerator == "cpu")
    client = connect()
    plan = plan_image(cell, client, log=log)
    ensure_wheelhouse(plan.requirements, plan.pip_args, log=log)
    build_all(Path(".distci") / "selfwheels", log=log)
    nonce = uuid.uuid4().hex[:8]
    tags = [f"{plan.tag}-bench-cold-{nonce}", f"{plan.tag}-bench-warm-{nonce}"]
    try:
        cold = ensure_image(cell, client, force=True, nocache=True, touch_fixes=f"cold {nonce}", tag=tags[0], log=log)
        warm = ensure_image(cell, client, force=True, touch_fixes=f"warm {nonce}", tag=tags[1], log=log)
    finally:
        for tag in tags:
            if image_exists(client, tag):
                client.images.remove(tag, noprune=False)
    ratio = cold.seconds / warm.seconds if warm.seconds else float("inf")
    table = Table(title=f"image build: {cell.id}")
    for col in ("build", "seconds", "steps cached"):
        table.add_column(col)
    table.add_row("cold (no cache)", f"{cold.seconds:.1f}", f"{len(cold.cached_steps)}/{cold.steps}")
    table.add_row("warm (fixes/ edited)", f"{warm.seconds:.1f}", f"{len(warm.cached_steps)}/{warm.steps}")
    console = Console()
    console.print(table)
    verdict = "met" if warm.seconds <= WARM_GOAL_S else "NOT met"
    console.print(f"cold/warm = {ratio:.1f}x; goal warm <= {WARM_GOAL_S:.0f}s {verdict}")
    return {"cold_s": cold.seconds, "warm_s": warm.seconds, "ratio": ratio}
