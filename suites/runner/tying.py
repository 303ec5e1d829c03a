"""Tied weights (the `tie` column): the output projection shares the token embedding's
weight, one parameter used by two modules, as Llama 3.2 1B/3B, small Qwen3 and Gemma do.

A layout must keep them one parameter. FSDP2 (parallelize.apply_fsdp) puts both modules
in the root unit, so the tied weight is sharded, gathered and reduced once, in exactly one
unit. TP shards both on the vocab dim (the embedding's RowwiseParallel and the output's
ColwiseParallel both place the weight Shard(0)), but parallelize_module distributes each
module's parameter on its own and so unties them: `retie` makes the output use the
embedding's (already distributed) parameter again right after TP, before AC, compile and
FSDP2 see the model, as torchtitan's qwen3 re-ties after its parallelisms.

Evidence: `tied(model)` is recorded after parallelize / fully_shard / compile, after the
last step and after a resume's load (training.py); checks.check_graph fails a run where
the two modules hold two parameters at any of those moments (`tie_problems`).
"""

from __future__ import annotations

from typing import Any

AFTER_PARALLELIZE = "after parallelize"
AFTER_LAST_STEP = "after the last step"
AFTER_RESUME = "after the resume load"


def retie(model: Any) -> None:
    """Makes the output projection use the embedding's parameter (a tied model whose
    layout replaced one of them); a no-op for untied models or a stage without both ends."""
    emb, out = getattr(model, "tok_embeddings", None), getattr(model, "output", None)
    if model.args.tie and emb is not None and out is not None and out.weight is not emb.weight:
        out.weight = emb.weight


def tied(model: Any) -> bool:
    """Whether the output projection and the token embedding hold ONE parameter object."""
    emb, out = getattr(model, "tok_embeddings", None), getattr(model, "output", None)
    return emb is not None and out is not None and out.weight is emb.weight


def moments(resumed: bool) -> tuple[str, ...]:
    """When a tie row's run must show the tie."""
    return (AFTER_PARALLELIZE, AFTER_LAST_STEP) + ((AFTER_RESUME,) if resumed else ())


def tie_problems(expected: tuple[str, ...], recorded: dict[str, bool]) -> list[str]:
    """A problem for every expected moment at which the tie was not seen (or not recorded)."""
    problems = []
    for when in expected:
        if when not in recorded:
            problems.append(f"the tie of output.weight and tok_embeddings.weight was not recorded {when}")
        elif not recorded[when]:
            problems.append(f"output.weight and tok_embeddings.weight are two parameters {when}: "
                            "the tied weight was untied")
    return problems
