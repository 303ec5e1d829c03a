"""The matrix's records: an Accelerator, a Tier, a Cell (one point of the matrix, its id made
of the DECLARED axes), and the expanded Matrix that selects cells by id or tier.
matrix.py loads and validates matrix.toml into these.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from distci.errors import SelectionError
from distci.sources import PACKAGE_AXES, Source
from distci.tomlloc import suggest as _suggest


CONTAINER_KEYS = ("memory", "pids", "cpus", "user", "network")
NETWORKS = ("none", "host", "bridge")
_MEMORY = re.compile(r"\d+(?:\.\d+)?[bkmg]?", re.IGNORECASE)
_UID_GID = re.compile(r"\d+:\d+")


@dataclass(frozen=True)
class ContainerLimits:
    """How a cell's container is confined: `[accelerators.<name>.container]` of matrix.toml.

    `memory` is docker's memory limit ("16g"; empty: none), `pids` the most processes and
    threads (0: none), `cpus` the CPUs it may use (0: all; capped at the host's count).
    `user`: "auto" runs as the controller's uid:gid, or as UNPRIVILEGED_USER when the
    controller is root; "root" opts out; "UID:GID" names one. `network`: "" keeps the
    family's (CPU: none, since gloo runs over loopback; CUDA/NPU: host).
    """

    memory: str = ""
    pids: int = 0
    cpus: float = 0.0
    user: str = "auto"
    network: str = ""

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> "ContainerLimits":
        """The limits of one table; ValueError naming the bad key, value and what is allowed."""
        unknown = sorted(set(table) - set(CONTAINER_KEYS))
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(CONTAINER_KEYS)}")
        memory = str(table.get("memory", ""))
        if memory and not _MEMORY.fullmatch(memory):
            raise ValueError(f"memory = {memory!r} is not a size like \"16g\" or \"512m\"")
        pids = table.get("pids", 0)
        if isinstance(pids, bool) or not isinstance(pids, int) or pids < 0:
            raise ValueError(f"pids = {pids!r} is not a whole number >= 0 (0: no limit)")
        cpus = table.get("cpus", 0)
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or cpus < 0:
            raise ValueError(f"cpus = {cpus!r} is not a number >= 0 (0: every CPU)")
        user = str(table.get("user", "auto"))
        if user not in ("auto", "root") and not _UID_GID.fullmatch(user):
            raise ValueError(f"user = {user!r} is not \"auto\", \"root\" or \"UID:GID\"")
        network = str(table.get("network", ""))
        if network and network not in NETWORKS:
            raise ValueError(f"network = {network!r} is not one of {', '.join(NETWORKS)}")
        return cls(memory, pids, float(cpus), user, network)


@dataclass(frozen=True)
class Accelerator:
    name: str
    backend: str
    runner: tuple[str, ...]
    archs: tuple[str, ...]
    variants: tuple[str, ...]
    family: str
    description: str = ""
    container: ContainerLimits = ContainerLimits()


@dataclass(frozen=True)
class Tier:
    name: str
    description: str = ""
    blocking_suites: tuple[str, ...] = ()
    shards: int = 1
    """Jobs each cell of the tier is split into (`distci run --shard K/N`): a nightly cell's
    531 tests take 78 min on 2 cores, one job's budget is 60."""


@dataclass(frozen=True)
class Cell:
    """One point of the matrix. `id` depends only on the declared axes."""

    accelerator: str
    arch: str
    variant: str
    torch: Source
    torchao: Source
    torchtitan: Source
    torch_npu: Source | None
    fixes: str
    world_size: int
    suites: tuple[str, ...]
    tiers: tuple[str, ...]
    runner: tuple[str, ...]
    backend: str
    python: str
    timeout: int = 300
    family: str = ""
    external: tuple[str, ...] = ()  # suites of suites/external.toml, run after `suites`
    requirements: tuple[str, ...] = ()  # extra pip requirement lines installed with the stack
    container: ContainerLimits = ContainerLimits()  # its accelerator's; not part of the id
    nodes: int = 1  # hosts the world spans, world_size // nodes ranks on each (distci.launch)
    baseline: str | None = None  # the cell it is judged against while a test has no history of its own here

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes

    @property
    def id(self) -> str:
        parts = [self.accelerator, self.variant]
        if self.arch != "x86_64":
            parts.append(self.arch)
        parts += [self.torch.id_fragment, self.torchao.id_fragment]
        if self.torchtitan.kind != "none":
            parts.append(self.torchtitan.id_fragment)
        if self.torch_npu is not None:
            parts.append(self.torch_npu.id_fragment)
        parts.append(f"ws{self.world_size}")
        if self.nodes != 1:
            parts.append(f"n{self.nodes}")
        parts.append(f"fix_{self.fixes}")
        return "-".join(parts)

    @property
    def sources(self) -> tuple[Source, ...]:
        found = (self.torch, self.torchao, self.torchtitan, self.torch_npu)
        return tuple(s for s in found if s is not None)

    def as_dict(self) -> dict[str, Any]:
        """The declared cell as plain data (JSON-able), for provenance and listings."""
        return {
            "id": self.id,
            "accelerator": self.accelerator,
            "arch": self.arch,
            "variant": self.variant,
            **{a: (s.declared if (s := getattr(self, a)) is not None else None) for a in PACKAGE_AXES},
            "fixes": self.fixes,
            "world_size": self.world_size,
            "nodes": self.nodes,
            "suites": list(self.suites),
            "tiers": list(self.tiers),
            "runner": list(self.runner),
            "backend": self.backend,
            "family": self.family,
            "python": self.python,
            "timeout": self.timeout,
            "external": list(self.external),
            "requirements": list(self.requirements),
            "container": asdict(self.container),
            **({"baseline": self.baseline} if self.baseline else {}),
        }


@dataclass(frozen=True)
class Matrix:
    path: Path
    cells: tuple[Cell, ...]
    tiers: dict[str, Tier]
    accelerators: dict[str, Accelerator]

    def cell(self, cell_id: str) -> Cell:
        return self.select([cell_id])[0]

    def default_cell(self, *, multi_node: bool = False) -> Cell:
        """The cell a command means when none is named: the pr tier's first CPU cell (it runs on
        any machine), else the pr tier's first cell. The one answer to "which cell by default".

        `multi_node`: for the commands only a multi-node cell makes sense for (a Slurm script,
        a TrainJob): the first such cell of the pr tier, else of the matrix, CPU first."""
        if multi_node:
            spread = [c for c in self.cells if c.nodes > 1]
            spread = [c for c in spread if "pr" in c.tiers] or spread
            if not spread:
                raise SelectionError("no multi-node cell (nodes > 1) to default to: name one with --cell CELL "
                                     "(list them with `nox -s matrix`)", where=str(self.path))
            return next((c for c in spread if c.accelerator == "cpu"), spread[0])
        pr = [c for c in self.cells if "pr" in c.tiers]
        if not pr:
            raise SelectionError("no cell in the pr tier to default to: name one with --cell CELL "
                                 "(list them with `nox -s matrix`)", where=str(self.path))
        return next((c for c in pr if c.accelerator == "cpu"), pr[0])

    def select(self, cell_ids: Sequence[str] | None = None, tier: str | None = None) -> list[Cell]:
        """Cells by id (shell globs allowed) and/or tier; all cells when neither is given."""
        cells = list(self.cells)
        if tier is not None:
            if tier not in self.tiers:
                raise SelectionError(f"unknown tier '{tier}'{_suggest(tier, self.tiers)}; "
                                     f"tiers: {', '.join(self.tiers)}", where=str(self.path))
            cells = [c for c in cells if tier in c.tiers]
        if not cell_ids:
            return cells
        chosen: dict[str, Cell] = {}
        for pattern in cell_ids:
            matched = [c for c in cells if fnmatch.fnmatchcase(c.id, pattern)]
            if not matched:
                raise SelectionError(self._no_cell_message(pattern, cells, tier), where=str(self.path))
            chosen.update((c.id, c) for c in matched)
        return list(chosen.values())

    def _no_cell_message(self, pattern: str, cells: list[Cell], tier: str | None) -> str:
        if tier is not None and any(fnmatch.fnmatchcase(c.id, pattern) for c in self.cells):
            return f"cell '{pattern}' is not in tier '{tier}'"
        close = difflib.get_close_matches(pattern, [c.id for c in cells], n=3, cutoff=0.5)
        hint = f" (did you mean: {', '.join(close)}?)" if close else ""
        return f"no cell '{pattern}'{hint}; list the cells with `nox -s matrix`"

    def actions_include(self, tier: str, *, sharded: bool = True) -> list[dict[str, Any]]:
        """The GitHub Actions ``strategy.matrix.include`` entries of a tier: one per cell, or,
        for a tier of N > 1 shards (and `sharded`), one per cell and share, with `shard`
        (``K/N``, for `--shard`) and `shard_name` (``KofN``, for artifact names)."""
        spec = self.tiers.get(tier)
        shards = spec.shards if spec is not None and sharded else 1
        entries = []
        for c in self.select(tier=tier):
            entry = {
                "cell": c.id,
                "accelerator": c.accelerator,
                "family": c.family,
                "runner": list(c.runner),
                "world_size": c.world_size,
                **({"nodes": c.nodes} if c.nodes != 1 else {}),
                "python": c.python,
                "tier": tier,
            }
            if shards == 1:
                entries.append(entry)
            else:
                entries += [{**entry, "shard": f"{k}/{shards}", "shard_name": f"{k}of{shards}"}
                            for k in range(1, shards + 1)]
        return entries
