"""A small llama-style model and torchtitan-style tensor-parallel plans for it.

The model has the parts where TP, compile, AC and Float8 interact in real training
stacks, built from the modules production models use so their own DTensor sharding
rules and compile paths are what gets tested: `nn.RMSNorm` (F.rms_norm, as torchtitan's
llama3), attention through SDPA with rotary embeddings and grouped KV heads,
`nn.Embedding`, a SwiGLU feed-forward, several blocks, module names as in torchtitan's llama3
(`layers.0.attention.wq`, `feed_forward.w1`, ...), so a plan written for torchtitan
reads the same here. The dims are tiny (CPU compiles stay fast) and chosen so every
sharded matmul dim stays a multiple of 16 for TP=2 and TP=4 (float8 kernels need it);
the `shard=uneven` rows change vocab and hidden width so that no mesh divides them
(ModelArgs.uneven).

Two variants real jobs run: LoRA-style adapters beside the column-parallel linears (the
`frozen` rows freeze everything else, embeddings included, so the first block's input
does not require grad), and a mixture-of-experts feed-forward (a router, top-k routing,
several experts; tokens are dispatched by index, so an expert that gets no token runs
on an empty batch as in real MoE code).

A tied model (args.tie) shares one parameter between the token embedding and the
output projection, as Llama 3.2 1B/3B, small Qwen3 and Gemma do: named_parameters()
lists it once, as `tok_embeddings.weight` (suites/runner/tying.py keeps layouts from untying it).

Attention and the feed-forward infer their local head count and width from the shapes
they get, as torchtitan's do, so the same module runs unsharded and column-sharded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..scenario.model_args import ModelArgs

__all__ = ["ModelArgs", "Transformer", "MoE", "Adapter", "build_model", "tp_plan", "TPStyles", "SHARDED_WEIGHTS",
           "ADAPTED", "frozen_by_default", "is_frozen"]


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
        if args.lora_rank:
            self.wq_adapter = Adapter(args.dim, args.n_heads * args.head_dim, args.lora_rank)
            self.wv_adapter = Adapter(args.dim, args.n_kv_heads * args.head_dim, args.lora_rank)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        q, v = self.wq(x), self.wv(x)
        if hasattr(self, "wq_adapter"):
            q = q + self.wq_adapter(x)
            v = v + self.wv_adapter(x)
        q = q.view(bs, seq, -1, self.head_dim)
        k = self.wk(x).view(bs, seq, -1, self.head_dim)
        v = v.view(bs, seq, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        n_rep = q.shape[2] // k.shape[2]
        if n_rep > 1:
            k = k.repeat_interleave(n_rep, dim=2)
            v = v.repeat_interleave(n_rep, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class Adapter(nn.Module):
    """LoRA: x -> b(a(x)), rank r; `b` is sharded like the linear it sits beside."""

    def __init__(self, dim_in: int, dim_out: int, rank: int) -> None:
        super().__init__()
        self.a = nn.Linear(dim_in, rank, bias=False)
        self.b = nn.Linear(rank, dim_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs, hidden: int | None = None) -> None:
        super().__init__()
        hidden = hidden or args.ffn_hidden
        self.w1 = nn.Linear(args.dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, args.dim, bias=False)
        self.w3 = nn.Linear(args.dim, hidden, bias=False)
        if args.lora_rank and hidden == args.ffn_hidden:
            self.w1_adapter = Adapter(args.dim, hidden, args.lora_rank)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h1 = self.w1(x)
        if hasattr(self, "w1_adapter"):
            h1 = h1 + self.w1_adapter(x)
        return self.w2(F.silu(h1) * self.w3(x))


class MoE(nn.Module):
    """Token-choice top-k mixture of experts, dispatched by index.

    The router's softmax picks top_k experts per token; each expert runs on exactly the
    tokens routed to it (an empty batch when it got none) and its output is scaled by
    the renormalized router weight and added back at the tokens' positions. The router
    has a bias (initialized in build_model) that makes the load imbalanced, as trained
    routers are: some expert gets no token in some microbatches.
    """

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.top_k = args.top_k
        self.router = nn.Linear(args.dim, args.n_experts, bias=True)
        self.experts = nn.ModuleList(FeedForward(args, args.expert_hidden) for _ in range(args.n_experts))
        self.steer = None
        """None, or a callable (n_experts) -> logit offset | None that steers the router to
        a routing edge (suites.runner.routing.steer)."""
        self.dispatch = None
        """None: every expert local; else a callable (moe, tokens, weights, chosen) -> output
        that moves tokens to experts elsewhere (suites.runner.parallelize.ExpertParallel)."""

    def router_logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """The router's float32 logits, steered (tokens, n_experts): what top-k picks from."""
        logits = self.router(tokens).float()
        offset = self.steer(logits.shape[-1]) if self.steer is not None else None
        if offset is not None:
            logits = logits + offset.to(logits.device)
        return logits

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights, chosen experts), each (tokens, top_k)."""
        scores = F.softmax(self.router_logits(tokens), dim=-1)
        weights, chosen = scores.topk(self.top_k, dim=-1)
        return (weights / weights.sum(-1, keepdim=True)).type_as(tokens), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        weights, chosen = self.route(tokens)
        if self.dispatch is not None:
            return self.dispatch(self, tokens, weights, chosen).view(shape)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token_idx, slot = torch.where(chosen == e)
            y = expert(tokens[token_idx]) * weights[token_idx, slot].unsqueeze(-1)
            out = out.index_add(0, token_idx, y)
        return out.view(shape)


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.feed_forward = MoE(args) if args.n_experts else FeedForward(args)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(args) for i in range(args.n_layers)})
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie:  # Llama 3.2 1B/3B, Qwen3 small, Gemma: one (vocab, dim) parameter, two modules
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("rope", rope_cache(args), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # A pipeline stage (suites/runner/pipeline.py) holds some blocks and maybe neither end.
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope)
        return self.output(self.norm(h)) if self.output is not None else h


ROUTER_BIAS = torch.tensor([0.4, 0.2, 0.0, -0.3, -0.5, -0.7, -0.9, -1.1])
"""A router bias that skews the load: the last experts get few tokens, some microbatches none."""

ADAPTED = ("attention.wq", "attention.wv", "feed_forward.w1")
"""The linears the LoRA adapters sit beside (`<name>_adapter`)."""


def frozen_by_default(name: str) -> bool:
    """Whether a parameter is frozen in a `lora` run (a frozen base with LoRA-style adapters): all but the adapters."""
    return "_adapter." not in name


def is_frozen(name: str, train: str) -> bool:
    """Whether a parameter is frozen under the `train` column, as fine-tuning freezes:
    `lora` (a frozen base with LoRA adapters), `frozen_embed` (the token embeddings:
    the first block's input then needs no grad), `frozen_norms` (every RMSNorm weight)."""
    if train == "lora":
        return frozen_by_default(name)
    if train == "frozen_embed":
        return name.startswith("tok_embeddings.")
    if train == "frozen_norms":
        return name.rsplit(".", 1)[0].endswith("norm")
    return False


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
            elif name.endswith("router.bias"):
                p.copy_(ROUTER_BIAS[: p.numel()])
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


def tp_plan(plan: str, styles: TPStyles, args: ModelArgs | None = None,
            loss_parallel: bool = False) -> tuple[dict, dict]:
    """(top-level plan, per-block plan) as torchtitan's llama3 `apply_tp` writes them.

    `tp`: Megatron-style column/row sharding, activations replicated between blocks.
    `tp_sp`: the same plus sequence parallelism: norms and residuals sharded on the
    sequence dim, all-gather before and reduce-scatter after each sharded region.
    `loss_parallel`: the output projection keeps its vocab shards (Shard(-1) DTensor
    logits) for a vocab-parallel cross entropy, as torchtitan's `loss_parallel` does.
    Adapters (args.lora_rank) get their `b` column-sharded like the linear beside them,
    behind a PrepareModuleInput that hands the adapter a local replicated input (its `a`
    stays a plain replicated weight). Experts (args.n_experts) are column/row sharded
    one by one; the router stays replicated (the `tp` plan only: the router sees a
    replicated plain tensor there).
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    try:
        from torch.distributed.tensor import Replicate, Shard
    except ImportError:  # torch < 2.5 spelled it _tensor
        from torch.distributed._tensor import Replicate, Shard

    args = args or ModelArgs()
    sp = plan == "tp_sp"
    if plan not in ("tp", "tp_sp"):
        raise ValueError(f"unknown TP plan {plan!r}; known: tp, tp_sp")
    if sp and args.n_experts:
        raise ValueError("the MoE block has a TP plan for `tp` only (its router takes a plain replicated input)")
    seq = Shard(1) if sp else Replicate()
    output = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False) if loss_parallel \
        else ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    top = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
        "output": output,
    }
    if sp:
        top["norm"] = SequenceParallel()
    block = {
        "attention.wq": styles.colwise(),
        "attention.wk": styles.colwise(),
        "attention.wv": styles.colwise(),
        "attention.wo": styles.rowwise(output_layouts=Shard(1)) if sp else styles.rowwise(),
    }
    if sp:
        block["attention_norm"] = SequenceParallel()
        block["attention"] = styles.prepare_input(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None))
        block["ffn_norm"] = SequenceParallel()
        block["feed_forward"] = styles.prepare_input(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    ffn = [f"feed_forward.experts.{e}" for e in range(args.n_experts)] if args.n_experts else ["feed_forward"]
    for prefix in ffn:
        block[f"{prefix}.w1"] = styles.colwise()
        block[f"{prefix}.w2"] = styles.rowwise(output_layouts=Shard(1)) if sp else styles.rowwise()
        block[f"{prefix}.w3"] = styles.colwise()
    if args.lora_rank:
        for name in ADAPTED:
            block[f"{name}_adapter"] = PrepareModuleInput(
                input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),), use_local_output=True)
            block[f"{name}_adapter.b"] = ColwiseParallel()
    return top, block


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


def sharded_weights(args: ModelArgs) -> dict[str, int]:
    """SHARDED_WEIGHTS for this model variant: experts one by one, adapters' `b` on dim 0."""
    out = dict(SHARDED_WEIGHTS)
    if args.n_experts:
        for i, dim in ((1, 0), (2, 1), (3, 0)):
            del out[f"feed_forward.w{i}.weight"]
            out.update({f"feed_forward.experts.{e}.w{i}.weight": dim for e in range(args.n_experts)})
    if args.lora_rank:
        out.update({f"{name}_adapter.b.weight": 0 for name in ADAPTED})
    return out
