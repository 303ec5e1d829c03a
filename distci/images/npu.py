"""torch_npu pairing: which torch and which CANN a torch_npu needs, and checking the CANN a run used.

Ascend's compatibility table (torch_npu package version -> CANN) comes from Ascend's own
documents: the Ascend/pytorch README's version table and, for torch_npu 2.13.0 and
2.14.0, the TorchNPU 26.2.0 release notes (branches v2.13.0-26.2.0 / v2.14.0-26.2.0,
CANN 9.2.0). torch_npu X.Y.Z[.postN] always pairs with torch X.Y.Z.

An npu image is labelled with the CANN its torch_npu pairs with
(`distci.cann.expected`); the run records the CANN it found in the container
(`DISTCI_CANN_VERSION` in the stack, read from the toolkit's version file). A run whose
CANN differs from the label did not test what the cell says: it is `infra`, with both.
"""

from __future__ import annotations

import re

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from distci.errors import ConfigError, InfraError

CANN_FOR_TORCH_NPU = {
    "2.14.0": "9.2.0", "2.13.0": "9.2.0", "2.12.0.post3": "9.2.0", "2.11.0.post3": "9.2.0",
    "2.10.0.post7": "9.2.0", "2.9.0.post9": "9.2.0", "2.7.1.post11": "9.2.0",
    "2.12.0.post2": "9.1.X", "2.11.0.post2": "9.1.X", "2.10.0.post6": "9.1.X", "2.9.0.post8": "9.1.X",
    "2.7.1.post10": "9.1.X", "2.12.0": "9.1.0", "2.11.0": "9.1.0", "2.10.0.post4": "9.1.0",
    "2.9.0.post6": "9.1.0", "2.7.1.post8": "9.1.0", "2.10.0": "9.0.0", "2.9.0.post2": "9.0.0",
    "2.8.0.post4": "9.0.0", "2.7.1.post4": "9.0.0", "2.9.0": "8.5.0", "2.8.0.post2": "8.5.0",
    "2.7.1.post2": "8.5.0", "2.6.0.post5": "8.5.0", "2.8.0": "8.3.RC1", "2.7.1": "8.3.RC1",
    "2.6.0.post3": "8.3.RC1", "2.6.0": "8.2.RC1", "2.5.1.post1": "8.2.RC1", "2.5.1": "8.1.RC1",
}


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


def cann_variant(cann: str) -> str:
    """The variant name of a CANN version, as matrix.toml spells it: 9.2.0 -> cann9.2, 8.3.RC1 -> cann8.3."""
    match = re.match(r"^(\d+)\.(\d+)", cann.strip())
    if not match:
        raise ConfigError(f"not a CANN version: {cann!r}")
    return f"cann{match.group(1)}.{match.group(2)}"


def cann_matches(expected: str, used: str) -> bool:
    """`9.1.X` matches any 9.1 release; otherwise the versions must be equal (case-insensitive)."""
    expected, used = expected.strip().lower(), used.strip().lower()
    if expected.endswith(".x"):
        return used.startswith(expected[:-1])
    return expected == used


def check_cann(expected: str | None, used: str | None, *, image: str) -> None:
    """InfraError naming both versions when the CANN a run found is not the one its image was built for."""
    if not expected or expected == "unknown":
        return
    if not used:
        raise InfraError(f"image {image} was built for CANN {expected}, but no CANN was found in the container "
                         f"(no ascend-toolkit version file)")
    if not cann_matches(expected, used):
        raise InfraError(f"image {image} was built for CANN {expected}, but the run used CANN {used}; "
                         f"rebuild the image on this runner or fix DISTCI_NPU_BASE_IMAGE")


# Run in a container of an npu image (after its entrypoint sourced CANN's set_env.sh):
# prints the toolkit's version, read from the install info Ascend's installer writes.
CANN_PROBE = (
    'home="${ASCEND_TOOLKIT_HOME:-/usr/local/Ascend/ascend-toolkit/latest}"; '
    'for f in "$home"/*/ascend_toolkit_install.info "$home"/version.cfg; do '
    '[ -f "$f" ] && sed -nE "s/^(version|Version)=//p" "$f" | head -n1 && exit 0; done; exit 0'
)
