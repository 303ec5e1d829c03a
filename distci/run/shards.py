"""Shards: a tier's tests split across N jobs (`distci run --shard K/N`).

A nightly cell's whole tier is over an hour on a 2-core runner; matrix.toml's
`tiers.<tier>.shards` makes each cell N jobs, each running every N-th test from the K-th
on (suites/conftest.py). run.json records the share as the run's selection
(`--shard K/N`), and distci.judge.coverage joins the latest ended run of every share into
the cell's complete run. This module owns the `K/N` text.
"""

from __future__ import annotations

from typing import Iterable

SHARD_PREFIX = "--shard "
"""How run.json's `selection` names a run's share."""


def parse_shard(text: str) -> tuple[int, int]:
    """(K, N) of a shard given as `K/N` (1 <= K <= N): the K-th of N shares of a tier's tests."""
    k, sep, n = text.partition("/")
    if not (sep and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
        raise ValueError(f"shard {text!r} is not K/N with 1 <= K <= N (e.g. --shard 1/2)")
    return int(k), int(n)


def shard_of(selection: Iterable[str]) -> tuple[int, int] | None:
    """(K, N) of a run narrowed by its shard alone (a run of the K-th share of its tier), else None."""
    selection = list(selection)
    if len(selection) != 1 or not selection[0].startswith(SHARD_PREFIX):
        return None
    try:
        return parse_shard(selection[0][len(SHARD_PREFIX):])
    except ValueError:
        return None
