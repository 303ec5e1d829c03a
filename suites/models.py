"""A small llama-style model and torchtitan-style tensor-parallel plans for it.

The model has the parts where TP, compile, AC and Float8 interact in real training
stacks: RMSNorm, attention through SDPA with rotary embeddings and grouped KV heads,
a SwiGLU feed-forward, several blocks, module names as in torchtitan's llama3
(`layers.0.attention.wq`, `feed_forward.w1`, ...), so a plan written for torchtitan
reads the same here. The dims are tiny (CPU compiles stay fast) and chosen so every
sharded matmul dim stays a multiple of 16 for TP=2 and TP=4 (float8 kernels need it).

Attention and the feed-forward infer their local head count and width from the shapes
they get, as torchtitan's do, so the same module runs unsharded and column-sharded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model_args import ModelArgs

__all__ = ["ModelArgs", "Transformer", "build_model", "tp_plan", "TPStyles", "SHARDED_WEIGHTS"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_cache(args: ModelArgs) -> torch.Tensor:
    """cos and sin of the rotary angles, shape (max_seq_len, head_dim // 2, 2)."""
    half = args.head_dim // 2
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, half, dtype=torch.float32) / half))
    angles = torch.outer(torch.arange(args.max_seq_len, dtype=torch.float32), inv_freq)
    return torch.stack((angles.cos(), angles.sin()), dim=-1)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotates pairs of x (bs, seq, heads, head_dim) by the cached angles (real arithmetic)."""
    bs, seq, heads, hd = x.shape
    pairs = x.float().reshape(bs, seq, heads, hd // 2, 2)
    cos = rope[:seq, None, :, 0]
    sin = rope[:seq, None, :, 1]
    a, b = pairs[..., 0], pairs[..., 1]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.reshape(bs, seq, heads, hd).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.head_dim = args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        q = self.wq(x).view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = self.wv(x).view(bs, seq, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        n_rep = q.shape[2] // k.shape[2]
        if n_rep > 1:
            k = k.repeat_interleave(n_rep, dim=2)
            v = v.repeat_interleave(n_rep, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(args.dim, args.ffn_hidden, bias=False)
        self.w2 = nn.Linear(args.ffn_hidden, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, args.ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("rope", rope_cache(args), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.rope)
        return self.output(self.norm(h))


def build_model(args: ModelArgs, seed: int) -> Transformer:
    """The model with weights drawn from `seed` alone (never from the global RNG).

    Every rank and the single-process reference call this with the same seed and get
    bit-identical weights, whatever ran before in the process.
    """
    gen = torch.Generator().manual_seed(seed)
    model = Transformer(args)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            if name.endswith(("wo.weight", "w2.weight")):
                p.div_((2 * args.n_layers) ** 0.5)
    return model


# ---- torchtitan-style tensor-parallel plans ---------------------------------------------


@dataclass(frozen=True)
class TPStyles:
    """The three parallel styles a plan is written with: plain, or torchao's Float8 ones.

    torchtitan swaps in Float8ColwiseParallel / Float8RowwiseParallel /
    PrepareFloat8ModuleInput for tensorwise Float8 (the all-gathers then move float8
    bytes) and keeps the plain styles for rowwise recipes; we do the same.
    """

    colwise: type
    rowwise: type
    prepare_input: type

    @staticmethod
    def for_float8(float8: str) -> "TPStyles":
        if float8 == "tensorwise":
            from torchao.float8.float8_tensor_parallel import (
                Float8ColwiseParallel,
                Float8RowwiseParallel,
                PrepareFloat8ModuleInput,
            )

            return TPStyles(Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput)
        from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

        return TPStyles(ColwiseParallel, RowwiseParallel, PrepareModuleInput)


def tp_plan(plan: str, styles: TPStyles) -> tuple[dict, dict]:
    """(top-level plan, per-block plan) as torchtitan's llama3 `apply_tp` writes them.

    `tp`: Megatron-style column/row sharding, activations replicated between blocks.
    `tp_sp`: the same plus sequence parallelism: norms and residuals sharded on the
    sequence dim, all-gather before and reduce-scatter after each sharded region.
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    try:
        from torch.distributed.tensor import Replicate, Shard
    except ImportError:  # torch < 2.5 spelled it _tensor
        from torch.distributed._tensor import Replicate, Shard

    if plan == "tp":
        top = {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        }
        block = {
            "attention.wq": styles.colwise(),
            "attention.wk": styles.colwise(),
            "attention.wv": styles.colwise(),
            "attention.wo": styles.rowwise(),
            "feed_forward.w1": styles.colwise(),
            "feed_forward.w2": styles.rowwise(),
            "feed_forward.w3": styles.colwise(),
        }
        return top, block
    if plan == "tp_sp":
        top = {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        }
        block = {
            "attention_norm": SequenceParallel(),
            "attention": styles.prepare_input(
                input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
            ),
            "attention.wq": styles.colwise(),
            "attention.wk": styles.colwise(),
            "attention.wv": styles.colwise(),
            "attention.wo": styles.rowwise(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": styles.prepare_input(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": styles.colwise(),
            "feed_forward.w2": styles.rowwise(output_layouts=Shard(1)),
            "feed_forward.w3": styles.colwise(),
        }
        return top, block
    raise ValueError(f"unknown TP plan {plan!r}; known: tp, tp_sp")


SHARDED_WEIGHTS = {
    "tok_embeddings.weight": 0,
    "output.weight": 0,
    "attention.wq.weight": 0,
    "attention.wk.weight": 0,
    "attention.wv.weight": 0,
    "attention.wo.weight": 1,
    "feed_forward.w1.weight": 0,
    "feed_forward.w2.weight": 1,
    "feed_forward.w3.weight": 0,
}
"""Name suffix -> the dim each plan shards that weight on; every other parameter is replicated."""
