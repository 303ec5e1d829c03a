"""Uneven shards (the `shard=uneven` column): evidence that a row's layout really split some
parameter unevenly, so a row whose dims some change made divisible again cannot pass as an
uneven one ("it ran" is not a pass).

After parallelize / fully_shard, every rank's local shard shapes are gathered; a parameter
is uneven when its local shape differs between ranks (FSDP2's dim-0 shards of the
257-token vocabulary: 129 and 128 rows; a TP vocab shard; an uneven hidden width).
"""

from __future__ import annotations

from typing import Any


def _local_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    from .evidence import clean_name

    return {clean_name(n): tuple((p.to_local() if hasattr(p, "to_local") else p).shape)
            for n, p in model.named_parameters()}


def uneven_params(model: Any) -> list[str]:
    """Parameters held by every rank whose local shard shape is not the same on all of them
    (a collective: every rank calls it)."""
    import torch.distributed as dist

    tables: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(tables, _local_shapes(model))
    common = set(tables[0]).intersection(*tables[1:])
    return sorted(n for n in common if len({t[n] for t in tables}) > 1)


def uneven_problems(layout: str | None, recorded: dict[str, list[str]]) -> list[str]:
    """A problem when `layout` (None: not an uneven row) split no parameter unevenly."""
    if layout is None:
        return []
    if layout not in recorded:
        return [f"the shard shapes of the {layout} layout were not recorded"]
    if not recorded[layout]:
        return [f"no parameter is sharded unevenly under {layout}: the uneven row ran even shards"]
    return []
