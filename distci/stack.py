"""Capture the Stack: exactly what a cell resolved to, from inside its environment.

Every stored result carries this, so a red cell can be reproduced and bisected: the
package versions, torch's git hash (release versions hide which commit a nightly or
source build is), CUDA / NCCL / CANN versions, driver, device names, Python, platform,
the fixes that were applied and, for containers, the image digest.

Runs inside cell environments on torch 2.5 through nightly: standard library and torch
only, every probe guarded, and nothing that initializes a device context eagerly beyond
what a test run does anyway.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import MISSING, dataclass, field, fields
from importlib import metadata
from typing import Any, Callable

TRACKED = ("torch", "torchao", "torchtitan", "torch_npu", "triton", "numpy", "pytest", "distci", "distci-fixes")


def _key(*, env: bool = False, summary: bool = False, default: Any = None) -> Any:
    """A Stack field. `env`: part of the environment fingerprint (two runs that agree on
    every env key ran the same software on the same kind of device, so a different outcome
    is flakiness; host names and capture times are deliberately not env keys). `summary`:
    shown as a JUnit property on every testcase."""
    meta = {"env": env, "summary": summary}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Stack:
    """What a cell resolved to, exactly; stored with every Result as a JSON object.

    Its fields are the one list of stack keys (KEYS; ENV_KEYS and SUMMARY_KEYS are
    derived from their metadata). Keys a reader does not know (a newer writer's, or what
    a partial stack adds) are kept in `extra`, so a round trip loses nothing.
    """

    python: str | None = _key(env=True, summary=True)
    implementation: str | None = _key()
    platform: str | None = _key()
    arch: str | None = _key()
    hostname_label: str | None = _key()
    image_digest: str | None = _key(env=True, summary=True)
    fixes_mode: str | None = _key(env=True)
    torch: str | None = _key(env=True, summary=True)
    torch_git: str | None = _key(env=True, summary=True)
    torchao: str | None = _key(env=True, summary=True)
    torchtitan: str | None = _key(env=True, summary=True)
    torch_npu: str | None = _key(env=True, summary=True)
    triton: str | None = _key(env=True)
    numpy: str | None = _key()
    pytest: str | None = _key()
    distci: str | None = _key()
    distci_fixes: str | None = _key(env=True)
    cuda: str | None = _key(env=True)
    hip: str | None = _key(env=True)
    cuda_available: bool = _key(default=False)
    device_count: int | None = _key()
    device_name: str | None = _key(env=True, summary=True)
    device_capability: str | None = _key()
    nccl: str | None = _key(env=True)
    driver: str | None = _key(env=True)
    cann: str | None = _key(env=True)
    fixes: Any = _key(env=True)
    packages: list[str] = _key(env=True, default=[])
    # each source as declared and as resolved (release / nightly / installed ...), from the controller
    sources: dict[str, Any] | None = _key()
    torch_import_error: str | None = _key()
    npu_import_error: str | None = _key()
    # a multi-node cell: each node's facts (NODE_KEYS) as that node reports them (distci.launch)
    nodes: list[dict[str, Any]] = _key(default=[])
    # a partial stack: the environment never came up (distci.run.cellrun)
    partial: bool = _key(default=False)
    declared: dict[str, Any] | None = _key()
    runner: str | None = _key()
    error: str | None = _key()
    extra: dict[str, Any] = field(default_factory=dict, metadata={"record": False})
    # the keys of the dict this Stack was read from, in order (None: built in code, by
    # capture or an infra record); to_dict writes them back as they were
    written: tuple[str, ...] | None = field(default=None, compare=False, repr=False, metadata={"record": False})

    def to_dict(self) -> dict[str, Any]:
        """The JSON object stored with results. A Stack read by from_dict gives back the
        same keys in the same order (absent stays absent, None stays None) plus any key
        set since to other than its default; one built in code gives every declared key,
        then `extra`'s."""
        if self.written is None:
            out = {k: getattr(self, k) for k in KEYS}
            if not self.partial:
                for k in _PARTIAL_KEYS:
                    out.pop(k)
            return {**out, **self.extra}
        out = {}
        for k in self.written:
            if k in _KEY_SET:
                out[k] = getattr(self, k)
            elif k in self.extra:
                out[k] = self.extra[k]
        for k in KEYS:
            if k not in out and getattr(self, k) != _DEFAULTS[k]:
                out[k] = getattr(self, k)
        for k, v in self.extra.items():
            out.setdefault(k, v)
        return out

    def get(self, key: str, default: Any = None) -> Any:
        """The value of a key named at run time (an ENV_KEYS entry, a package axis, a key
        only `extra` holds) as the stored JSON object has it: `default` when absent. A key
        fixed in the code reads as an attribute (`stack.torch`)."""
        if key not in _KEY_SET:
            return self.extra.get(key, default)
        value = getattr(self, key)
        if self.written is None:
            absent = key in _PARTIAL_KEYS and not self.partial
        else:
            absent = key not in self.written and value == _DEFAULTS[key]
        return default if absent else value

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Stack":
        """A Stack from its JSON object (results.jsonl, stack.json, the store): any subset of
        the keys, unknown ones kept in `extra`; `to_dict` gives the same dict back."""
        if not isinstance(data, dict):
            raise TypeError(f"a Stack is a JSON object, not {type(data).__name__}")
        known = {k: v for k, v in data.items() if k in _KEY_SET}
        return cls(**known, extra={k: v for k, v in data.items() if k not in _KEY_SET}, written=tuple(data))


KEYS: tuple[str, ...] = tuple(f.name for f in fields(Stack) if f.metadata.get("record", True))
_KEY_SET = frozenset(KEYS)
_PARTIAL_KEYS = ("partial", "declared", "runner", "error")  # written only by a partial stack
_DEFAULTS: dict[str, Any] = {f.name: f.default_factory() if f.default_factory is not MISSING else f.default
                             for f in fields(Stack) if f.name in _KEY_SET}
ENV_KEYS: tuple[str, ...] = tuple(f.name for f in fields(Stack) if f.metadata.get("env"))
"""Stack keys that define an environment (see _key)."""
SUMMARY_KEYS: tuple[str, ...] = tuple(f.name for f in fields(Stack) if f.metadata.get("summary"))


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - a missing probe must never break capture
        return None


def _torch_facts(stack: dict[str, Any]) -> None:
    import torch

    stack["torch"] = torch.__version__
    stack["torch_git"] = _safe(lambda: torch.version.git_version)
    stack["cuda"] = _safe(lambda: torch.version.cuda)
    stack["hip"] = _safe(lambda: torch.version.hip)
    stack["cuda_available"] = _safe(torch.cuda.is_available) or False
    if stack["cuda_available"]:
        stack["device_count"] = _safe(torch.cuda.device_count)
        stack["device_name"] = _safe(lambda: torch.cuda.get_device_name(0))
        cap = _safe(lambda: torch.cuda.get_device_capability(0))
        stack["device_capability"] = f"{cap[0]}.{cap[1]}" if cap else None
        nccl = _safe(torch.cuda.nccl.version)
        stack["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl
        stack["driver"] = _nvidia_driver()
    elif _version("torch_npu"):
        _npu_facts(stack)
    else:
        stack["device_name"] = platform.processor() or platform.machine()
        stack["device_count"] = os.cpu_count()


def _nvidia_driver() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _npu_facts(stack: dict[str, Any]) -> None:
    import torch

    try:
        import torch_npu  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - without CANN torch_npu cannot import
        stack["npu_import_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return
    npu = getattr(torch, "npu", None)
    stack["device_count"] = _safe(npu.device_count) if npu else None
    stack["device_name"] = _safe(lambda: npu.get_device_name(0)) if npu else None
    stack["cann"] = _safe(lambda: torch.version.cann) or os.environ.get("ASCEND_TOOLKIT_HOME")


def _fixes() -> Any:
    try:
        import distci_fixes
    except ImportError:
        return None
    return _safe(distci_fixes.report)


def capture(*, import_torch: bool = True) -> dict[str, Any]:
    """The Stack of the running interpreter, as the JSON-serializable dict results carry."""
    return capture_stack(import_torch=import_torch).to_dict()


def capture_stack(*, import_torch: bool = True) -> Stack:
    """The Stack of the running interpreter."""
    stack: dict[str, Any] = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "arch": platform.machine(),
        "hostname_label": os.environ.get("DISTCI_RUNNER", ""),
        "image_digest": os.environ.get("DISTCI_IMAGE_DIGEST") or None,
        "fixes_mode": os.environ.get("DISTCI_FIXES", "all"),
    }
    for dist in TRACKED:
        key = dist.replace("-", "_")
        if key != "torch":
            stack[key] = _version(dist)
    if import_torch:
        try:
            _torch_facts(stack)
        except Exception as exc:  # noqa: BLE001 - a partial stack is still provenance
            stack["torch"] = _version("torch")
            stack["torch_import_error"] = f"{type(exc).__name__}: {exc}"[:300]
    else:
        stack["torch"] = _version("torch")
    stack["fixes"] = _fixes()
    # Each source as the controller declared and resolved it (source=installed for a
    # preinstalled stack, the version a 'latest' or 'nightly' source meant tonight).
    stack["sources"] = _safe(lambda: json.loads(os.environ["DISTCI_SOURCES"])) if os.environ.get("DISTCI_SOURCES") else None
    stack["packages"] = sorted(
        f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions() if d.metadata["Name"]
    )
    return Stack(**stack)


NODE_KEYS = ("platform", "arch", "torch", "driver", "cuda", "cann", "device_count", "device_name", "device_capability")
"""What a multi-node cell records of every node: a node's own host, driver and devices (its
packages are the cell's, installed the same way everywhere)."""


def node_facts() -> dict[str, Any]:
    """This host's entry of `Stack.nodes`: its hostname and NODE_KEYS."""
    import socket

    stack = capture()
    return {"host": socket.gethostname(), **{key: stack.get(key) for key in NODE_KEYS}}


def main(argv: list[str] | None = None) -> int:
    """`python -m distci.stack` prints the Stack as JSON (used for infra records);
    `--node` prints this host's node facts (a multi-node cell asks each node)."""
    args = sys.argv[1:] if argv is None else argv
    json.dump(node_facts() if "--node" in args else capture(), sys.stdout, indent=1, sort_keys=True, default=str)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
