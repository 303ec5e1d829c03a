"""Building a cell's image: plan -> wheelhouse -> context -> the daemon (legacy builder, no network).

The build log is streamed: a progress bar on a terminal, one line per step in CI logs,
the whole log in a file. Building needs access to the daemon (the docker group), not root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from distci.run.fitting import cell_tag
from distci.errors import ConfigError, InfraError
from distci.images.base import IMAGES_DIR, image_exists
from distci.images.context import render_context, split_stack, stack_label
from distci.images.npu import cann_variant, check_npu_pairing
from distci.images.plan import plan_image
from distci.cells import Cell
from distci.provision.selfwheels import build_all
from distci.provision.wheelhouse import ensure_wheelhouse

Log = Callable[[str], None]


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


def _as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Context entries as the image gets them (root-owned): the layer cache then does not
    depend on which user rendered the context (the daemon checksums the tar headers)."""
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


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
                    tar.add(entry, arcname=str(entry.relative_to(path)), recursive=False, filter=_as_root)
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
        log(f"{cell_tag(cell.id)}image {ref}: exists, not rebuilt")
        return BuiltImage(tag=ref, id=image.id, built=False, labels=dict(image.labels or {}))
    prefix = f"{cell_tag(cell.id)}"
    wheelhouse = ensure_wheelhouse(plan.requirements, plan.pip_args, python=plan.python, target=plan.target,
                                   log=lambda m: log(prefix + m))
    own = build_all(Path(".distci") / "selfwheels", log=lambda m: log(prefix + m))
    marker_env = plan.target.marker_env() if plan.target else None
    cann = check_npu_pairing(split_stack(wheelhouse, env=marker_env)[0]) if plan.family == "npu" else None
    if cann and cell.variant != cann_variant(cann):
        raise ConfigError(f"cell {cell.id}: its torch_npu pairs with CANN {cann}, so its variant must be "
                          f"{cann_variant(cann)}, not {cell.variant} (matrix.toml [accelerators.npu] variants)")
    IMAGES_DIR.mkdir(parents=True, exist_ok=True)
    context = Path(tempfile.mkdtemp(prefix=f"context-{plan.family}-", dir=IMAGES_DIR)) / "context"
    try:
        layers = render_context(plan, wheelhouse, own, context, touch_fixes=touch_fixes, marker_env=marker_env)
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

