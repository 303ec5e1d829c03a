"""A cell's image plan: its content-addressed tag, known before anything is downloaded or built.

The tag is ``distci/<family>:<cell-id>-<inputs>`` where `inputs` hashes everything that
goes into the image: the family's Dockerfile directory, the base image (reference and
image id), the wheelhouse key, distci's and the fix package's sources, the suites, the
optional proxy files. An existing tag is never rebuilt, so a warm runner decides in
milliseconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from distci.run.cellrun import stack_inputs
from distci.errors import ConfigError
from distci.images.base import DOCKER_DIR, FAMILIES, INPUTS_LENGTH, image_exists, resolve_base
from distci.cells import Cell
from distci.provision.selfwheels import REPO, SOURCES, source_hash
from distci.provision.wheelhouse import wheelhouse_key
from distci.provision.files import sha256_file
from distci.provision.wheeltarget import WheelTarget, interpreter_tags

Log = Callable[[str], None]

MAX_TAG = 128
PROXY_FILES = {"DISTCI_CA_BUNDLE": "ca-bundle.crt", "DISTCI_PIP_CONF": "pip.conf"}


@dataclass(frozen=True)
class ImagePlan:
    """What a cell's image is made of, known before anything is downloaded or built."""

    cell: Cell
    family: str
    tag: str
    inputs_hash: str
    base_image: str
    requirements: list[str]
    pip_args: list[str]
    python: str
    inputs: dict[str, Any]
    target: WheelTarget | None = None  # the wheelhouse is downloaded for the cell's Python, not built by `python`


def image_tag(family: str, cell_id: str, inputs_hash: str) -> str:
    """``distci/<family>:<cell-id>-<inputs>``; a cell id too long for a tag is shortened, the hash kept."""
    room = MAX_TAG - len(inputs_hash) - 1
    name = cell_id if len(cell_id) <= room else cell_id[: room - 9] + "-" + hashlib.sha256(cell_id.encode()).hexdigest()[:8]
    return f"distci/{family}:{name}-{inputs_hash}"


def family_of(cell: Cell) -> str:
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


def wheel_target(cell: Cell) -> tuple[str, WheelTarget | None]:
    """Who makes the image's wheelhouse: (interpreter, None) when it is the cell's Python, else a target.

    DISTCI_IMAGE_PYTHON names an interpreter of the cell's Python (it then resolves and
    builds, sdists included); without it a controller of another Python (>= 3.9)
    downloads the wheels for the cell's Python and arch (wheels only). The arch must be
    this host's: images are built where they run.
    """
    python = os.environ.get("DISTCI_IMAGE_PYTHON") or sys.executable
    here = interpreter_tags(python)
    if not here["platform"].endswith(cell.arch):
        raise ConfigError(f"cell {cell.id} is for {cell.arch}, but this host is {here['platform']}; "
                          f"build its image on a {cell.arch} runner")
    wanted = "cpython" + cell.python.replace(".", "")
    if here["python"] == wanted:
        return python, None
    if os.environ.get("DISTCI_IMAGE_PYTHON"):
        raise ConfigError(f"cell {cell.id} needs Python {cell.python}, but DISTCI_IMAGE_PYTHON={python} is "
                          f"{here['python']}")
    return python, WheelTarget(cell.python, cell.arch)


def plan_image(cell: Cell, client, *, log: Log = print) -> ImagePlan:
    """Resolve a cell's stack and hash every input of its image into its tag."""
    family = family_of(cell)
    python, target = wheel_target(cell)
    base = resolve_base(family, cell.python, client, log=log)  # before any index is read: an unpinned base stops here
    tags = target.tags() if target else interpreter_tags(python)
    _, requirements, pip_args = stack_inputs(cell, python=python,
                                             tags=target.packaging_tags() if target else None)
    base_id = client.images.get(base).id if image_exists(client, base) else None
    inputs = {
        "schema": 1,
        "family": family,
        "docker": source_hash(DOCKER_DIR, (family,)),
        "base": base,
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
                     base_image=base, requirements=requirements, pip_args=pip_args, python=python, inputs=inputs,
                     target=target)

