"""The models generator's model code and layouts: one builder for the reference and the
parallel run (the reference is never more convenient than the code users run).

Vocabulary: a *structure* is a point of model_space (features); the *model* is what
`build` makes of it; a *layout* is how `parallelize` spreads it over the ranks (FSDP2
units, a TP plan, DDP, replicate), the same upstream APIs torchtitan and HF trainers call.

The MoE feed-forward is written as HF Mixtral / Qwen-MoE and torchtitan's for-loop path
write it: route, then for each expert the tokens it got, `continue` when it got none; an
expert skipped on a rank has no gradient there (the reference may still give it one:
other ranks' tokens reached it).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model_space import complete

DIM = 16
HIDDEN = 32
VOCAB = 32
SEQ = 4
BATCH_PER_RANK = 1
"""Tokens per rank and microbatch (4): few enough that an expert often gets none on a rank."""
SEED = 20261206
LR = 0.1


class Expert(nn.Module):
    def __init__(self, dim: int, hidden: int, param: str = "none") -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        if param == "weight_norm":
            nn.utils.parametrizations.weight_norm(self.w1)
        elif param == "spectral_norm":
            nn.utils.parametrizations.spectral_norm(self.w1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)))


class LoopMoE(nn.Module):
    """Top-k routing and a per-expert loop that skips experts without tokens (module docstring)."""

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int, shared: bool) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(experts))
        self.shared_expert = Expert(dim, hidden) if shared else None
        self.skipped: list[int] = []
        """Experts the last forward skipped on this rank (no token): the plants read it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        probs = F.softmax(self.router(flat), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.top_k > 1:  # top-k renormalized (Mixtral, Qwen norm_topk_prob); top-1 keeps its probability (Switch)
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(flat.dtype)
        out = torch.zeros_like(flat)
        self.skipped = []
        for e, expert in enumerate(self.experts):
            token_idx, slot = torch.where(chosen == e)
            if token_idx.numel() == 0:
                self.skipped.append(e)
                continue
            out = out.index_add(0, token_idx, expert(flat[token_idx]) * weights[token_idx, slot, None])
        if self.shared_expert is not None:
            out = out + self.shared_expert(flat)
        return out.view_as(x)


def _rope_cache(seq: int, dim: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), freqs)
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)


class Block(nn.Module):
    def __init__(self, s: dict[str, Any], hidden: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(DIM) if hasattr(nn, "RMSNorm") else nn.LayerNorm(DIM)
        self.ffn = (LoopMoE(DIM, hidden, s["experts"], s["top_k"], s["shared_expert"]) if s["experts"]
                    else Expert(DIM, hidden, s["param"]))
        self.buffer = s["buffer"]
        if self.buffer == "rope":
            cos, sin = _rope_cache(SEQ, DIM)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
        elif self.buffer == "persistent":
            self.register_buffer("scale", 0.5 + torch.arange(DIM, dtype=torch.float32) / (2 * DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        if self.buffer == "rope":
            half = h.shape[-1] // 2
            rotated = torch.cat([-h[..., half:], h[..., :half]], -1)
            h = h * self.cos[: h.shape[1]] + rotated * self.sin[: h.shape[1]]
        out = self.ffn(h)
        if self.buffer == "persistent":
            out = out * self.scale
        return x + out


MTP_WEIGHT = 0.3
"""DeepSeek-V3's weight of the MTP loss; the MTP logits join the main ones with it, so the
loop's one loss trains both uses of the head."""


class MultiTokenPrediction(nn.Module):
    """An MTP module as DeepSeek-V3 / Megatron-LM write one: its own norm and projection, then
    the model's output head (registered here too: one module, two parents)."""

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(DIM) if hasattr(nn, "RMSNorm") else nn.LayerNorm(DIM)
        self.proj = nn.Linear(DIM, DIM, bias=False)
        self.head = head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(self.norm(h)))


class StructureModel(nn.Module):
    def __init__(self, structure: dict[str, Any]) -> None:
        super().__init__()
        s = complete(structure)
        self.structure = s
        vocab, hidden = (VOCAB + 1, HIDDEN - 1) if s["uneven"] else (VOCAB, HIDDEN)
        self.tok = nn.Embedding(vocab, DIM)
        self.layers = nn.ModuleList(Block(s, hidden) for _ in range(s["blocks"]))
        self.norm = nn.RMSNorm(DIM) if hasattr(nn, "RMSNorm") else nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, vocab, bias=False)
        if s["tie"]:
            self.output.weight = self.tok.weight
        self.mtp = MultiTokenPrediction(self.output) if s["mtp"] else None

    @property
    def vocab(self) -> int:
        return self.tok.num_embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        for block in self.layers:
            x = block(x)
        if self.structure["reuse"]:
            x = self.layers[0](x)
        logits = self.output(self.norm(x))
        if self.mtp is not None:
            logits = logits + MTP_WEIGHT * self.mtp(x)
        return logits


def build(structure: dict[str, Any], device: torch.device) -> StructureModel:
    """The structure's model, the same weights on every rank and in the reference (seeded)."""
    torch.manual_seed(SEED)
    model = StructureModel(structure)
    with torch.no_grad():  # embeddings and head at a transformer's scale, not N(0, 1)
        model.tok.weight.normal_(0, 1 / math.sqrt(DIM))
    return model.to(device)


def data(structure: dict[str, Any], vocab: int, world_size: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per step, per microbatch: (tokens, labels) of the global batch (every rank's rows, in rank order)."""
    s = complete(structure)
    gen = torch.Generator().manual_seed(SEED + 1)
    rows = BATCH_PER_RANK * world_size
    return [[(torch.randint(0, vocab, (rows, SEQ), generator=gen), torch.randint(0, vocab, (rows, SEQ), generator=gen))
             for _ in range(s["accum"])] for _ in range(s["steps"])]


def data_parallel(parallel: str) -> bool:
    """Each rank trains on its own rows (FSDP2, DDP, replicate); TP ranks all see every row."""
    return parallel != "tp"


def parallelize(model: StructureModel, mesh: Any) -> nn.Module:
    """Lays `model` out as its structure says; returns what the training loop calls."""
    s = model.structure
    if s["parallel"] == "fsdp":
        _fully_shard(model, mesh, s["wrap"])
        return model
    if s["parallel"] == "tp":
        _tensor_parallel(model, mesh)
        return model
    unused = bool(s["experts"])  # an expert without tokens on a rank: DDP must be told (users pass it for MoE)
    if s["parallel"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, process_group=mesh.get_group(), find_unused_parameters=unused)
    from torch.distributed._composable.replicate import replicate

    replicate(model, device_mesh=mesh, **({"find_unused_parameters": True} if unused else {}))
    return model


def _fully_shard(model: StructureModel, mesh: Any, wrap: str) -> None:
    from ..runner.fsdp import fsdp_api

    fully_shard, _ = fsdp_api()
    blocks = list(model.layers)
    units = {"blocks": blocks, "root": [], "subset": blocks[:1], "nested": blocks, "grouped": blocks}[wrap]
    for block in units:
        if wrap == "nested":
            fully_shard(block.ffn, mesh=mesh)
        fully_shard(block, mesh=mesh)
    if wrap == "grouped":  # torchtitan: fully_shard([model.norm, model.output]); tied weights share one unit
        group = [model.norm, model.output] + ([model.tok] if model.structure["tie"] else [])
        fully_shard(group + ([model.mtp] if model.mtp is not None else []), mesh=mesh)
    fully_shard(model, mesh=mesh)
    if model.structure["experts"] and hasattr(model, "set_reduce_scatter_unused_params"):
        # an expert idle on one rank has no gradient there: without this FSDP2 reduce-scatters
        # different tensors on different ranks (pytorch#158719: a hang, or gloo's abort); MoE
        # users opt in where the stack has it, as DDP users pass find_unused_parameters
        model.set_reduce_scatter_unused_params(True)


def _tensor_parallel(model: StructureModel, mesh: Any) -> None:
    """Megatron's feed-forward plan on every plain expert (w1 column-, w2 row-sharded); the
    router, norms, embedding and head stay replicated; a parametrized projection is left
    whole (parallelize_module shards a module's own parameters, a parametrization keeps
    them one level down)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {}
    for name, module in model.named_modules():
        if isinstance(module, Expert) and not nn.utils.parametrize.is_parametrized(module.w1):
            plan[f"{name}.w1"], plan[f"{name}.w2"] = ColwiseParallel(), RowwiseParallel()
    parallelize_module(model, mesh, plan)
