"""Cell images: plan + tag, build context, build (Docker SDK), the docker run backend.

    base.py     the daemon connection; base images (public, digest-pinned; or the local debootstrap one)
    plan.py     a cell's content-addressed tag, known before anything is downloaded
    context.py  the build context: Dockerfile, hash-pinned wheel layers, distci's wheels, suites
    npu.py      torch_npu <-> torch <-> CANN pairing; the CANN a run used vs the image's label
    build.py    plan -> wheelhouse -> context -> the daemon (legacy builder, no network)
    run.py      the suites in a container; labels, SIGTERM, teardown; device access per family
    command.py  `distci images`, `distci teardown`, `distci bench images`
"""

from distci.images.base import connect, ensure_local_base, local_base_tag, public_bases, resolve_base
from distci.images.build import BuiltImage, ensure_image
from distci.images.command import add_parser, bench_images
from distci.images.context import split_stack
from distci.images.npu import check_cann, check_npu_pairing
from distci.images.plan import image_tag, plan_image
from distci.images.run import container_options, run_cell_in_docker, run_cells_in_docker, teardown

__all__ = [
    "PUBLIC_BASES", "BuiltImage", "add_parser", "bench_images", "check_cann", "check_npu_pairing", "connect",
    "container_options", "ensure_image", "ensure_local_base", "image_tag", "local_base_tag", "plan_image",
    "public_bases", "resolve_base", "run_cell_in_docker", "run_cells_in_docker", "split_stack", "teardown",
]


def __getattr__(name: str):  # PEP 562: PUBLIC_BASES is read on first use (distci.images.base)
    if name == "PUBLIC_BASES":
        return public_bases()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
