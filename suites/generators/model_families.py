"""Model families beyond the decoder LM (model_space's `family`): the vision transformers
and the encoder-decoder FSDP2 / DDP trainers train, built once for the parallel run and the
reference.

Vocabulary: a *family* is the kind of network a structure's blocks, inputs and head make;
`lm` is model_structures.StructureModel. Each family here keeps the attribute names the
layouts read (`layers` the blocks, `norm` and `output` the final norm and head, `tok` None:
no token embedding), so model_structures.apply_fsdp places its units on them unchanged.

Where the vision transformer differs from the LM, and where bugs live:
  - the patch embedding is a Conv2d (timm PatchEmbed, torchvision's conv_proj): a 4-D
    weight with a bias, what FSDP2's dim-0 sharding pads on an uneven split;
  - the class token and position embedding are bare `nn.Parameter`s on the ROOT module
    (timm VisionTransformer.cls_token / pos_embed): trainers fully_shard the blocks, then
    the root, so FSDP2's root unit owns parameters no submodule's forward reads;
  - LayerNorm with bias, and biased projections (timm qkv_bias=True);
  - attention: `vit`, timm's Attention (one fused qkv Linear, reshape, `unbind(0)`, SDPA,
    proj); `vit_mha`, torchvision's EncoderBlock (`nn.MultiheadAttention`, batch_first: its
    in_proj_weight is a bare Parameter, its out_proj a NonDynamicallyQuantizableLinear whose
    weight F.multi_head_attention_forward reads without calling the module);
  - class-token pooling into a classification head over images, one label per image.
Where the encoder-decoder (T5) differs: one embedding registered in the root, the encoder
and the decoder (three parents of one module: FSDP2 units around the stacks both claim it); a
relative position bias only each stack's first block owns, whose output every later block
adds to its scores (one parameter, used by every block's forward, reduced in the first
block's unit); cross attention over the encoder's output (a gradient into the encoder from
every decoder block).
Sources: timm/models/vision_transformer.py (Block, VisionTransformer._pos_embed,
forward_head), timm/layers/attention.py (Attention), torchvision/models/vision_transformer.py
(EncoderBlock, VisionTransformer.class_token), transformers' models/t5/modeling_t5.py
(T5Stack, T5Attention.compute_bias, _relative_position_bucket).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

IMAGE = 8
PATCH = 4
CHANNELS = 3
CLASSES = 10
HEADS = 2
TOKENS = (IMAGE // PATCH) ** 2 + 1
"""Patches and the class token."""


class Mlp(nn.Module):
    """timm's Mlp (fc1, GELU, fc2, biased); `ffn` in a block, the name wrap=nested wraps."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class FusedAttention(nn.Module):
    """timm's Attention: one qkv Linear, `unbind(0)` into q, k, v, SDPA (not causal), proj."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.head_dim = dim // HEADS
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, HEADS, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class VitBlock(nn.Module):
    """timm's Block / torchvision's EncoderBlock: pre-norm attention and MLP, both residual."""

    def __init__(self, dim: int, hidden: int, mha: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, HEADS, batch_first=True) if mha else FusedAttention(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.ffn = Mlp(dim, hidden)
        self.mha = mha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + (self.attn(h, h, h, need_weights=False)[0] if self.mha else self.attn(h))
        return x + self.ffn(self.norm2(x))


class PatchEmbed(nn.Module):
    """timm's PatchEmbed: a Conv2d of stride PATCH, flattened to (batch, patches, dim)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(CHANNELS, dim, PATCH, PATCH)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.proj(images).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    """timm's VisionTransformer at toy size: patch embedding, the root's class token and
    position embedding, blocks, final norm, class-token pooling, head."""

    def __init__(self, s: dict[str, Any], dim: int, hidden: int) -> None:
        super().__init__()
        self.structure = s
        self.patch_embed = PatchEmbed(dim)
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.empty(1, TOKENS, dim))
        self.layers = nn.ModuleList(VitBlock(dim, hidden, s["family"] == "vit_mha") for _ in range(s["blocks"]))
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, CLASSES)
        self.tok = None
        self.mtp = None
        self.running = list(range(s["blocks"]))
        with torch.no_grad():  # timm's init_weights: pos_embed trunc_normal(.02), cls_token normal(1e-6)
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
            nn.init.normal_(self.cls_token, std=1e-6)

    @property
    def vocab(self) -> int:
        """The classes (model_structures.data draws labels below it)."""
        return CLASSES

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """timm's patch_embed then _pos_embed: the class token first, the position embedding added."""
        x = self.patch_embed(images)
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images)
        for i in self.running:
            x = self.layers[i](x)
        if self.structure["reuse"]:
            x = self.layers[0](x)
        return self.output(self.norm(x)[:, 0])


BUCKETS = 8
MAX_DISTANCE = 16


def relative_bucket(relative: torch.Tensor, bidirectional: bool) -> torch.Tensor:
    """T5's `_relative_position_bucket` (HF modeling_t5): exact buckets for small distances,
    log-spaced up to MAX_DISTANCE; the encoder's bidirectional, the decoder's causal."""
    buckets, out = BUCKETS, torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        out += (relative > 0).long() * buckets
        relative = relative.abs()
    else:
        relative = -torch.clamp(relative, max=0)
    exact = buckets // 2
    large = exact + (torch.log(relative.float().clamp_min(1) / exact) / math.log(MAX_DISTANCE / exact)
                     * (buckets - exact)).long()
    return out + torch.where(relative < exact, relative, large.clamp(max=buckets - 1))


class T5Attention(nn.Module):
    """T5's attention: q k v o without bias, no 1/sqrt(d) scaling, a position bias added to
    the scores. Only the first layer of a stack owns `relative_attention_bias`; it returns
    the bias it computed, and every later layer receives it (HF T5Stack's `position_bias`)."""

    def __init__(self, dim: int, relative: bool, causal: bool) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.relative_attention_bias = nn.Embedding(BUCKETS, HEADS) if relative else None
        self.causal = causal

    def compute_bias(self, q_len: int, k_len: int) -> torch.Tensor:
        relative = torch.arange(k_len)[None, :] - torch.arange(q_len)[:, None]
        buckets = relative_bucket(relative.to(self.relative_attention_bias.weight.device), not self.causal)
        return self.relative_attention_bias(buckets).permute(2, 0, 1).unsqueeze(0)

    def forward(self, x: torch.Tensor, kv: torch.Tensor | None = None,
                position_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        kv = x if kv is None else kv
        b, n, c = x.shape
        q, k, v = (w(t).view(b, t.shape[1], HEADS, -1).transpose(1, 2) for w, t in ((self.q, x), (self.k, kv), (self.v, kv)))
        if position_bias is None:
            position_bias = (self.compute_bias(n, kv.shape[1]) if self.relative_attention_bias is not None
                             else torch.zeros(1, HEADS, n, kv.shape[1], device=x.device))
            if self.causal:
                mask = torch.ones(n, kv.shape[1], dtype=torch.bool, device=x.device).triu(1)
                position_bias = position_bias.masked_fill(mask, torch.finfo(position_bias.dtype).min)
        scores = q @ k.transpose(-1, -2) + position_bias
        out = F.softmax(scores.float(), dim=-1).type_as(scores) @ v
        return self.o(out.transpose(1, 2).reshape(b, n, c)), position_bias


class T5Block(nn.Module):
    """T5's block: self attention, cross attention over the encoder's output (decoder only),
    the ReLU feed-forward (wi, wo: `ffn`), each behind its own RMS norm, all residual."""

    def __init__(self, dim: int, hidden: int, first: bool, decoder: bool) -> None:
        super().__init__()
        self.norm1 = nn.RMSNorm(dim) if hasattr(nn, "RMSNorm") else nn.LayerNorm(dim)
        self.attn = T5Attention(dim, first, causal=decoder)
        self.cross_norm = (nn.RMSNorm(dim) if hasattr(nn, "RMSNorm") else nn.LayerNorm(dim)) if decoder else None
        self.cross = T5Attention(dim, False, causal=False) if decoder else None
        self.norm2 = nn.RMSNorm(dim) if hasattr(nn, "RMSNorm") else nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, hidden, bias=False), nn.ReLU(), nn.Linear(hidden, dim, bias=False))

    def forward(self, x: torch.Tensor, position_bias: torch.Tensor | None = None,
                memory: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        h, position_bias = self.attn(self.norm1(x), position_bias=position_bias)
        x = x + h
        if self.cross is not None:
            x = x + self.cross(self.cross_norm(x), memory)[0]
        return x + self.ffn(self.norm2(x)), position_bias


class T5Stack(nn.Module):
    def __init__(self, dim: int, hidden: int, blocks: int, decoder: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(T5Block(dim, hidden, i == 0, decoder) for i in range(blocks))
        self.norm = nn.RMSNorm(dim) if hasattr(nn, "RMSNorm") else nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        position_bias = None
        for block in self.layers:
            x, position_bias = block(x, position_bias, memory)
        return self.norm(x)


class EncoderDecoder(nn.Module):
    """T5 at toy size: one `shared` embedding (`tok`) for the encoder's and the decoder's
    tokens, registered in both stacks as HF's T5Stack holds `embed_tokens` (and the head when
    tied, scaled by dim**-0.5 as T5 v1.0), an encoder stack, a decoder stack with cross
    attention, the LM head. Its input packs (encoder tokens, decoder tokens) along
    dim 1 so a data-parallel rank's rows are one tensor's rows."""

    def __init__(self, s: dict[str, Any], dim: int, hidden: int, vocab: int) -> None:
        super().__init__()
        self.structure = s
        self.tok = nn.Embedding(vocab, dim)
        self.encoder = T5Stack(dim, hidden, s["blocks"], decoder=False)
        self.decoder = T5Stack(dim, hidden, s["blocks"], decoder=True)
        self.encoder.embed_tokens = self.decoder.embed_tokens = self.tok  # HF: T5Stack(config, self.shared)
        self.output = nn.Linear(dim, vocab, bias=False)
        if s["tie"]:
            self.output.weight = self.tok.weight
        self.mtp = None
        self.running = list(range(2 * s["blocks"]))

    @property
    def layers(self) -> list[nn.Module]:
        """Every block, the encoder's then the decoder's: FSDP2's per-block units."""
        return [*self.encoder.layers, *self.decoder.layers]

    @property
    def norm(self) -> nn.Module:
        return self.decoder.norm

    @property
    def vocab(self) -> int:
        return self.tok.num_embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        memory = self.encoder(self.encoder.embed_tokens(tokens[:, 0]))
        h = self.decoder(self.decoder.embed_tokens(tokens[:, 1]), memory)
        return self.output(h * self.tok.embedding_dim ** -0.5 if self.structure["tie"] else h)


FAMILIES = {"vit": VisionTransformer, "vit_mha": VisionTransformer, "encdec": EncoderDecoder}


def model(structure: dict[str, Any], dim: int, hidden: int, vocab: int) -> nn.Module:
    if structure["family"] == "encdec":
        built = EncoderDecoder(structure, dim, hidden, vocab)
        with torch.no_grad():  # the embedding at a transformer's scale, as the LM's
            built.tok.weight.normal_(0, 1 / math.sqrt(dim))
        return built
    return FAMILIES[structure["family"]](structure, dim, hidden)


def freeze(model: nn.Module, frozen: str) -> None:
    """`embedding`: the vision transformer's patch embedding frozen (MoCo v3's fixed random
    patch projection, fine-tuning recipes that keep a pretrained stem); the encoder-decoder's
    shared embedding (and the head tied to it)."""
    if frozen == "embedding":
        (model.tok if isinstance(model, EncoderDecoder) else model.patch_embed).requires_grad_(False)


def checkpoint(model: nn.Module, wrap: Callable[[nn.Module], None]) -> None:
    """Activation checkpointing of every block: `wrap` takes the module holding `layers`."""
    for holder in (model.encoder, model.decoder) if isinstance(model, EncoderDecoder) else (model,):
        wrap(holder)


def data(structure: dict[str, Any], rows: int, vocab: int, length: Callable[[int], int],
         gen: torch.Generator) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per step, per microbatch: the global batch. Images and one label each; or (encoder
    tokens, decoder tokens) packed along dim 1 and the decoder's labels, the n-th batch
    `length(n)` long (model_batches)."""
    lengths = iter(range(structure["steps"] * structure["accum"]))

    def one() -> tuple[torch.Tensor, torch.Tensor]:
        seq = length(next(lengths))
        if structure["family"] == "encdec":
            return (torch.randint(0, vocab, (rows, 2, seq), generator=gen),
                    torch.randint(0, vocab, (rows, seq), generator=gen))
        return torch.randn(rows, CHANNELS, IMAGE, IMAGE, generator=gen), torch.randint(0, CLASSES, (rows,), generator=gen)
    return [[one() for _ in range(structure["accum"])] for _ in range(structure["steps"])]
