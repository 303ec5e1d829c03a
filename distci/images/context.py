"""A cell image's build context, rendered into a directory and streamed to the daemon as a tar.

The context holds: the family's Dockerfile, the wheelhouse split into two hash-pinned
locks (the torch stack, then torchao/torchtitan), distci's own wheels, the suites and
the proxy files. Everything the build installs comes from it: the build runs with no
network. Only the legacy builder is assumed (no BuildKit, no ``RUN --mount``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable

from packaging.markers import default_environment
from packaging.utils import canonicalize_name, parse_wheel_filename

from distci.run.cellrun import HARNESS_REQUIREMENTS
from distci.images.base import DOCKER_DIR
from distci.images.plan import PROXY_FILES, ImagePlan
from distci.provision.selfwheels import REPO
from distci.provision.wheelhouse import Wheelhouse
from distci.provision.files import sha256_file
from distci.provision.wheeltarget import wheel_requires

# The torch-stack layer holds these and everything they need; the rest of the
# wheelhouse (torchao, torchtitan and their own dependencies) is the layer above.
STACK_ROOTS = ("torch", "torch-npu", *HARNESS_REQUIREMENTS)


def split_stack(wheelhouse: Wheelhouse, roots: Iterable[str] = STACK_ROOTS,
                env: dict[str, str] | None = None) -> tuple[list[dict], list[dict]]:
    """The wheelhouse's wheels as (torch stack, the rest): the closure of `roots`, then what is left.

    Dependencies come from each wheel's METADATA with markers evaluated for the
    interpreter the wheelhouse is for (`env`: a WheelTarget's markers; default this one)
    and requested extras followed (torch asks for ``cuda-toolkit[cublas,...]``), so each
    lock is complete on its own.
    """
    wheels = {canonicalize_name(w["name"]): w for w in wheelhouse.manifest["wheels"]}
    env = env or default_environment()
    wanted: dict[str, set[str]] = {}
    todo = [(canonicalize_name(r), frozenset()) for r in roots if canonicalize_name(r) in wheels]
    while todo:
        name, extras = todo.pop()
        seen = wanted.get(name)
        if seen is not None and extras <= seen:
            continue
        wanted[name] = (seen or set()) | extras
        for req in wheel_requires(wheelhouse.path / wheels[name]["filename"]):
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


def own_entry(wheel: Path) -> dict:
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return {"filename": wheel.name, "name": str(name), "version": str(version), "sha256": sha256_file(wheel)}


def render_context(plan: ImagePlan, wheelhouse: Wheelhouse, own_wheels: list[Path], dest: Path,
                   *, touch_fixes: str | None = None, marker_env: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Write the build context of `plan` into `dest`; return the wheels of each layer.

    `touch_fixes` adds a file to the fix-package layer, as an edit of fixes/ would (the
    bench and the layer-reuse test use it without touching the checkout).
    """
    shutil.copytree(DOCKER_DIR / plan.family, dest, ignore=shutil.ignore_patterns("*.md", "__pycache__"))
    stack, rest = split_stack(wheelhouse, env=marker_env)
    _write_wheels(dest / "wheels" / "stack", wheelhouse.path, stack)
    _write_wheels(dest / "wheels" / "top", wheelhouse.path, rest)
    by_name = {canonicalize_name(own_entry(w)["name"]): w for w in own_wheels}
    for layer, name in (("distci", "distci"), ("fixes", "distci-fixes")):
        wheel = by_name.get(canonicalize_name(name))
        entries = [own_entry(wheel)] if wheel else []
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


def stack_label(wheelhouse: Wheelhouse, own_wheels: list[Path]) -> dict[str, str]:
    """The exact versions an image carries, for its `distci.stack` label."""
    wanted = {"torch", "torchao", "torchtitan", "torch-npu", "triton", "numpy", "pytest", "distci", "distci-fixes"}
    entries = list(wheelhouse.manifest["wheels"]) + [own_entry(w) for w in own_wheels]
    return {canonicalize_name(w["name"]): w["version"] for w in entries if canonicalize_name(w["name"]) in wanted}

