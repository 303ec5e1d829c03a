"""Bisect in the cell's image (`--backend docker`): the same bisect, probed by the image's Python.

A CUDA or NPU regression depends on what the cell's image holds (CANN, the CUDA wheels'
view of the driver, the cell's Python); a bisect on the host would probe with the
host's. With `--backend docker` the bisect command runs again, unchanged but for the
backend, in a container of the cell's image (distci.images builds or reuses it): the
checkout and every existing absolute path of the arguments mounted at their own paths,
the cell's devices and device group (distci.images.run.container_options), the network
(candidates are downloaded), the runner's uid. Probe environments are made from the
image's interpreter (`--python /venv/bin/python`), so each candidate sees the cell's
CANN / CUDA and Python. Inside, `python -m distci.bisect` parses the bisect
arguments alone: the image carries distci without its controller dependencies.

The container carries the job's labels (distci.images.run.run_labels), so SIGTERM stops
it and the workflow's always-run teardown step removes what a harder kill leaves.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

Log = Callable[[str], None]

BACKENDS = ("host", "docker")


def add_options(p: argparse.ArgumentParser) -> None:
    """The bisect CLI's two options for this backend."""
    p.add_argument("--backend", choices=BACKENDS, default="host",
                   help="host: probe here; docker: run the bisect in the cell's image (its CANN/CUDA and Python)")
    p.add_argument("--image-cell", default=None,
                   help="with --backend docker: the cell whose image runs the bisect (default: --cell, else "
                        "the default cell, as `distci run`)")


def in_image_argv(argv: Sequence[str], python: str) -> list[str]:
    """The bisect arguments for the container: the backend options dropped, the image's Python for probes."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in ("--backend", "--image-cell", "--python"):
            skip = "=" not in arg
            continue
        out.append(arg)
    if "--" in out:
        cut = out.index("--")
        return [*out[:cut], f"--python={python}", *out[cut:]]
    return [*out, f"--python={python}"]


def path_mounts(argv: Sequence[str], cwd: Path) -> dict[str, dict[str, str]]:
    """The working directory and every existing absolute path an argument names, at their own paths."""
    paths = {cwd.resolve()}
    for arg in argv:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if value.startswith("/") and Path(value).exists():
            paths.add(Path(value).resolve())
        elif value.startswith("/") and Path(value).parent.exists():  # an output file to be written
            paths.add(Path(value).parent.resolve())
    keep = sorted(p for p in paths if not any(q != p and q in p.parents for q in paths))
    return {str(p): {"bind": str(p), "mode": "rw"} for p in keep}


def run_in_image(cell_id: str | None, argv: Sequence[str], *, matrix_path: str = "matrix.toml",
                 log: Log = print) -> int:
    """Run `distci bisect argv` in a container of `cell_id`'s image (None: the default cell's); its exit code."""
    from distci.errors import InfraError
    from distci.images.base import connect
    from distci.images.build import ensure_image
    from distci.images.plan import family_of
    from distci.images.run import IMAGE_PYTHON, container_options, run_labels, sigterm_stops
    from distci.matrix import load_matrix

    matrix = load_matrix(matrix_path)
    cell = matrix.cell(cell_id) if cell_id else matrix.default_cell()
    log(f"bisect: in the image of cell {cell.id}{'' if cell_id else ' (the default cell; --image-cell for another)'}")
    client = connect()
    options = container_options(family_of(cell))
    image = ensure_image(cell, client, log=log)
    options["network_mode"] = "host"  # candidates are downloaded from the indexes
    volumes = {**options.pop("volumes", {}), **path_mounts(argv, Path.cwd())}
    inner = [str(IMAGE_PYTHON), "-m", "distci.bisect", *in_image_argv(argv, str(IMAGE_PYTHON))]
    env = {k: v for k, v in os.environ.items() if k.startswith(("DISTCI_", "PIP_")) or k.lower().endswith("_proxy")}
    env.update(HOME=os.environ.get("HOME", "/tmp") if os.geteuid() == 0 else "/tmp", PYTHONUNBUFFERED="1")
    run_id = "bisect-" + hashlib.sha256("\0".join(argv).encode()).hexdigest()[:12]
    # The bisect reads and writes the caller's own paths (--wheelhouse, --cache, --out), mounted
    # where they are: it runs as the caller, not as the cell runs' unprivileged user.
    caller = f"{os.getuid()}:{os.getgid()}"
    log(f"bisect: in image {image.tag} ({cell.id})")
    container = None
    try:
        with sigterm_stops():
            container = client.containers.run(image.tag, inner, detach=True, working_dir=str(Path.cwd().resolve()),
                                              user=caller, environment=env, volumes=volumes,
                                              labels=run_labels(run_id, cell.id), **options)
            for chunk in container.logs(stream=True, follow=True):
                sys.stdout.write(chunk.decode("utf-8", "replace"))
                sys.stdout.flush()
            return int(container.wait().get("StatusCode", 1))
    except Exception as exc:  # noqa: BLE001 - Stopped, DockerException: the container goes either way
        if isinstance(exc, InfraError):
            raise
        raise InfraError(f"bisect in image {image.tag} did not finish: {exc}") from None
    finally:
        if container is not None:
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
