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

from .model_batches import MAX_SEQ, SEQ, length, pad
from .model_space import complete

DIM = 16
HIDDEN = 32
VOCAB = 32
BATCH_PER_RANK = 1
"""Tokens per rank and microbatch (4): few enough that an expert often gets none on a rank."""
PP_ROWS = 4
"""Rows of a pipelined step: as many as the most microbatches drawn (model_space); under
pp_fsdp each dp_shard group's rows (PP_ROWS * PP_DP_SHARD in all)."""
PP_DP_SHARD = 2
"""pp_fsdp's dp_shard degree: each of its 2x2 mesh's pipelines trains on its own rows."""
SEED = 20261206
LR = 0.1


LORA_RANK = 2
LORA_ALPHA = 4.0


class LoRALinear(nn.Module):
    """A LoRA adapter around an existing projection, as PEFT's lora.Linear wraps its
    `base_layer`: out = base(x) + B(A(x)) * alpha / rank, B zero at init (torchtune, PEFT)."""

    def __init__(self, base: nn.Linear) -> None:
        super().__init__()
        self.base_layer = base
        self.lora_a = nn.Linear(base.in_features, LORA_RANK, bias=False)
        self.lora_b = nn.Linear(LORA_RANK, base.out_features, bias=False)
        nn.init.zeros_(self.lora_b.weight)

    @property
    def weight(self) -> torch.Tensor:
        return self.base_layer.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.lora_b(self.lora_a(x)) * (LORA_ALPHA / LORA_RANK)


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

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int, shared: bool, balance: bool = False) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(experts))
        self.shared_expert = Expert(dim, hidden) if shared else None
        self.skipped: list[int] = []
        """Experts the last forward skipped on this rank (no token): the plants read it."""
        self.balance = balance
        if balance:  # torchtitan moe.py: the bias persists (checkpointed), the counts do not
            self.register_buffer("expert_bias", torch.zeros(experts, dtype=torch.float32))
            self.register_buffer("tokens_per_expert", torch.zeros(experts, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        probs = F.softmax(self.router(flat), dim=-1, dtype=torch.float32)
        if self.balance:  # the bias picks the experts; the weights stay the unbiased scores
            chosen = torch.topk(probs + self.expert_bias, self.top_k, dim=-1).indices
            weights = probs.gather(-1, chosen)
            with torch.no_grad():
                self.tokens_per_expert.add_(torch.bincount(chosen.flatten(), minlength=len(self.experts)))
        else:
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


def _rotate(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `h` (..., seq, dim), the rotate-half form of HF Llama."""
    half = h.shape[-1] // 2
    return h * cos[: h.shape[-2]] + torch.cat([-h[..., half:], h[..., :half]], -1) * sin[: h.shape[-2]]


HEADS = 2


class Attention(nn.Module):
    """Llama's attention (torchtitan llama3 / HF LlamaAttention): wq wk wv, causal SDPA, wo;
    the rope cache arrives as arguments, as torchtitan passes freqs_cis. Heads come from the
    projection's width (`view(..., -1, head_dim)`), so a column-sharded wq gives each TP rank
    its own heads, as torchtitan's model code reads them."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.head_dim = dim // HEADS
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor, *rope: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        if rope:
            q, k = _rotate(q, *rope), _rotate(k, *rope)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self, s: dict[str, Any], hidden: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(DIM) if hasattr(nn, "RMSNorm") else nn.LayerNorm(DIM)
        self.ffn = (LoopMoE(DIM, hidden, s["experts"], s["top_k"], s["shared_expert"], s["balance"]) if s["experts"]
                    else Expert(DIM, hidden, s["param"]))
        self.buffer = s["buffer"]
        # registered after norm and ffn: the parameters of a structure without attention
        # keep their order, so a gradient find keeps its signature when attn shrinks away
        self.attention_norm = (nn.RMSNorm(DIM) if hasattr(nn, "RMSNorm") else nn.LayerNorm(DIM)) if s["attn"] else None
        self.attention = Attention(DIM) if s["attn"] else None
        if self.buffer == "rope":  # Llama rotates q and k (per head); without attention, the normed input
            cos, sin = _rope_cache(MAX_SEQ, DIM // HEADS if s["attn"] else DIM)  # sliced to each batch's length
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
        elif self.buffer == "persistent":
            self.register_buffer("scale", 0.5 + torch.arange(DIM, dtype=torch.float32) / (2 * DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.attention is not None:
            x = x + self.attention(self.attention_norm(x), *((self.cos, self.sin) if self.buffer == "rope" else ()))
        h = self.norm(x)
        if self.buffer == "rope" and self.attention is None:
            h = _rotate(h, self.cos, self.sin)
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
        self.running = list(range(s["blocks"]))
        """The blocks this model runs: every one, or a pipeline stage's (model_pipeline.cut)."""

    @property
    def vocab(self) -> int:
        return self.tok.num_embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Tokens to logits; a pipeline stage without the embedding takes activations, and
        one without the head returns them (torchtitan's models tolerate deleted modules)."""
        x = tokens if self.tok is None else self.tok(tokens)
        for i in self.running:
            x = self.layers[i](x)
        if self.structure["reuse"]:
            x = self.layers[0](x)
        if self.output is None:
            return x
        logits = self.output(self.norm(x))
        if self.mtp is not None:
            logits = logits + MTP_WEIGHT * self.mtp(x)
        return logits


def build(structure: dict[str, Any], device: torch.device) -> nn.Module:
    """The structure's model, the same weights on every rank and in the reference (seeded)."""
    torch.manual_seed(SEED)
    s = complete(structure)
    if s["family"] != "lm":  # a vision transformer or an encoder-decoder (model_families.py)
        from . import model_families

        model = model_families.model(s, DIM, HIDDEN, VOCAB)
        model_families.freeze(model, s["frozen"])
        model_families.checkpoint(model, lambda holder: _checkpoint(holder, s["ac"]))
        return model.to(device)
    model = StructureModel(structure)
    with torch.no_grad():  # embeddings and head at a transformer's scale, not N(0, 1)
        model.tok.weight.normal_(0, 1 / math.sqrt(DIM))
    _freeze(model, model.structure["frozen"])
    _checkpoint(model, model.structure["ac"])
    return model.to(device)


def _freeze(model: StructureModel, frozen: str) -> None:
    """torchtune's LoRA recipes: adapters on the projections, only the adapters train."""
    if frozen == "embedding":
        model.tok.weight.requires_grad_(False)
    elif frozen == "lora":
        for expert in [m for m in model.modules() if isinstance(m, Expert)]:
            expert.w1, expert.w2 = LoRALinear(expert.w1), LoRALinear(expert.w2)
        adapters = {id(p) for m in model.modules() if isinstance(m, LoRALinear)
                    for p in (*m.lora_a.parameters(), *m.lora_b.parameters())}
        for p in model.parameters():
            p.requires_grad_(id(p) in adapters)


def _checkpoint(model: nn.Module, ac: str) -> None:
    """torchtitan's apply_ac: every block in a checkpoint wrapper (non-reentrant, RNG state not
    preserved); `selective` is its op-level policy: save matmul outputs, recompute the rest."""
    if ac == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from .program_checkpointing import selective_context

    kwargs: dict[str, Any] = {"preserve_rng_state": False}
    if ac == "selective":
        kwargs["context_fn"] = selective_context()
    for i, block in enumerate(model.layers):
        model.layers[i] = checkpoint_wrapper(block, **kwargs)


BALANCE_RATE = 0.05
"""The bias step per update (torchtitan's load_balance_coeff is 1e-3: on a model this small,
three steps of it would move no token; this one moves some)."""


@torch.no_grad()
def update_expert_bias(model: nn.Module) -> None:
    """torchtitan's `_update_expert_bias`, an optimizer step pre-hook: the step's token counts
    summed over the data-parallel ranks (`model.balance_groups`, one per mesh axis, set by
    parallelize; none in the reference and under TP, where every rank saw every token), then
    each bias moves toward the under-loaded experts and the counts restart."""
    import torch.distributed as dist

    moes = [m for m in model.modules() if isinstance(m, LoopMoE) and m.balance]
    if not moes:
        return
    counts = torch.vstack([m.tokens_per_expert for m in moes])
    for group in getattr(model, "balance_groups", []):
        dist.all_reduce(counts, group=group)
    for moe, count in zip(moes, counts):
        delta = BALANCE_RATE * torch.sign(count.mean() - count)
        moe.expert_bias.add_(delta - delta.mean())
        moe.tokens_per_expert.zero_()


def data(structure: dict[str, Any], vocab: int, world_size: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per step, per microbatch: (tokens, labels) of the global batch (every rank's rows, in rank order)."""
    s = complete(structure)
    gen = torch.Generator().manual_seed(SEED + 1)
    rows = {"pp": PP_ROWS, "pp_tp": PP_ROWS, "pp_fsdp": PP_ROWS * PP_DP_SHARD}.get(s["parallel"],
                                                                                BATCH_PER_RANK * world_size)
    if s["family"] != "lm":
        from . import model_families

        batches = model_families.data(s, rows, vocab, lambda n: length(s, n), gen)
    else:
        lengths = iter(range(s["steps"] * s["accum"]))
        batches = [[(torch.randint(0, vocab, (rows, n), generator=gen), torch.randint(0, vocab, (rows, n), generator=gen))
                    for n in [length(s, next(lengths)) for _ in range(s["accum"])]] for _ in range(s["steps"])]
    if s["pad"]:  # model_batches: drawn after the batches, so an unpadded structure's numbers stay
        batches = [[pad(tokens, labels, gen) for tokens, labels in micro] for micro in batches]
    return batches


def data_parallel(parallel: str) -> bool:
    """Each rank (fsdp_tp: each dp_shard group) trains on its own rows; TP ranks all see every
    row, and so does a pipeline (every stage runs every microbatch; pp_tp: every tp index's)."""
    return parallel not in ("tp", "pp", "pp_tp")


def loss_context(structure: dict[str, Any], parallel_side: bool):
    """torchtitan's train step: forward and backward (a pipeline's: the schedule's step, inside
    its train context) under `loss_parallel()` when the head returns vocab-sharded logits; the
    reference computes whole logits, without it."""
    import contextlib

    if parallel_side and structure["loss_parallel"]:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def dp_groups(structure: dict[str, Any], mesh: Any) -> list[list[int]]:
    """The ranks of each data-parallel shard, in row order: one rank each; under plain TP
    one group of every rank; under fsdp_tp each dp_shard index's TP group (every rank of a
    group sees the same rows); under pp_fsdp each dp_shard index's pipeline."""
    if structure["parallel"] in ("tp", "pp", "pp_tp"):
        return [[int(r) for r in mesh.mesh.flatten()]]
    if structure["parallel"] == "pp_fsdp":
        return [[int(r) for r in column] for column in mesh.mesh.T]
    if structure["parallel"] == "fsdp_tp":
        return [[int(r) for r in row] for row in mesh.mesh]
    return [[int(r)] for r in mesh.mesh.flatten()]


def parallelize(model: StructureModel, mesh: Any) -> nn.Module:
    """Lays `model` out as its structure says; returns what the training loop calls."""
    s = model.structure
    dp_axes = ["dp_shard"] if s["parallel"] == "fsdp_tp" else list(range(mesh.ndim))
    model.balance_groups = ([mesh.get_group(axis) for axis in dp_axes]
                            if data_parallel(s["parallel"]) and s["balance"] else [])
    from .model_compile import compile_model

    if s["parallel"] in ("fsdp", "hsdp"):  # a 2-D mesh makes fully_shard HSDP
        compile_blocks(model)
        apply_fsdp(model, mesh, s["wrap"])
        return compile_model(model, model, s)
    if s["parallel"] in ("tp", "fsdp_tp"):  # torchtitan's parallelize_llama: TP, compile, then FSDP2 over dp_shard
        from .model_plans import apply_plan

        apply_plan(model, mesh["tp"] if s["parallel"] == "fsdp_tp" else mesh, s["plan"], s["loss_parallel"])
        compile_blocks(model)
        if s["parallel"] == "fsdp_tp":
            apply_fsdp(model, mesh["dp_shard"], s["wrap"])
        return compile_model(model, model, s)
    compile_blocks(model)
    kwargs: dict[str, Any] = {}
    if s["experts"]:  # an expert without tokens on a rank: DDP must be told (users pass it for MoE)
        kwargs["find_unused_parameters"] = True
    if s["balance"]:  # the token counts are each rank's own until the pre-hook sums them
        kwargs["broadcast_buffers"] = False
    if s["parallel"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return compile_model(model, DistributedDataParallel(model, process_group=mesh.get_group(), **kwargs), s)
    from torch.distributed._composable.replicate import replicate

    replicate(model, device_mesh=mesh, **kwargs)
    return compile_model(model, model, s)


def compile_blocks(model: nn.Module) -> None:
    """compile=blocks (model_compile.py): every block of the model (an encoder-decoder: of
    each stack), after its TP plan, before FSDP2 or DDP, as torchtitan's parallelize orders them."""
    from .model_compile import compile_blocks as compile_holder

    s = model.structure
    if s["family"] != "lm":
        from . import model_families

        model_families.checkpoint(model, lambda holder: compile_holder(holder, s))
    else:
        compile_holder(model, s)


def apply_fsdp(model: StructureModel, mesh: Any, wrap: str) -> None:
    """FSDP2's units as `wrap` places them; a pipeline stage (pp_fsdp) wraps the blocks it
    runs and, for grouped, the ends it holds, as torchtitan's parallelize runs on each stage."""
    from ..runner.fsdp import fsdp_api

    fully_shard, _ = fsdp_api()
    blocks = [model.layers[i] for i in model.running]
    units = {"blocks": blocks, "root": [], "subset": blocks[:1], "nested": blocks, "grouped": blocks}[wrap]
    for block in units:
        if wrap == "nested":
            fully_shard(block.ffn, mesh=mesh)
        fully_shard(block, mesh=mesh)
    if wrap == "grouped" and model.norm is not None:  # torchtitan: fully_shard([model.norm, model.output])
        group = [model.norm, model.output] + ([model.tok] if model.structure["tie"] and model.tok is not None else [])
        fully_shard(group + ([model.mtp] if model.mtp is not None else []), mesh=mesh)
    if model.structure["stacks"]:  # an encoder-decoder's halves (model_families.EncoderDecoder)
        fully_shard(model.encoder, mesh=mesh)
        fully_shard(model.decoder, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if model.structure["experts"] and hasattr(model, "set_reduce_scatter_unused_params"):
        # an expert idle on one rank has no gradient there: without this FSDP2 reduce-scatters
        # different tensors on different ranks (pytorch#158719: a hang, or gloo's abort); MoE
        # users opt in where the stack has it, as DDP users pass find_unused_parameters
        model.set_reduce_scatter_unused_params(True)
