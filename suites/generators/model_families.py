"""Model families beyond the decoder LM (model_space's `family`): the vision transformers
FSDP2 / DDP trainers train, built once for the parallel run and the reference.

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
Sources: timm/models/vision_transformer.py (Block, VisionTransformer._pos_embed,
forward_head), timm/layers/attention.py (Attention), torchvision/models/vision_transformer.py
(EncoderBlock, VisionTransformer.class_token).
"""

from __future__ import annotations

from typing import Any

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


FAMILIES = {"vit": VisionTransformer, "vit_mha": VisionTransformer}


def model(structure: dict[str, Any], dim: int, hidden: int) -> nn.Module:
    return FAMILIES[structure["family"]](structure, dim, hidden)


def freeze(model: nn.Module, frozen: str) -> None:
    """`embedding`: the patch embedding frozen (MoCo v3's fixed random patch projection,
    fine-tuning recipes that keep a pretrained stem)."""
    if frozen == "embedding":
        model.patch_embed.requires_grad_(False)


def data(structure: dict[str, Any], rows: int, gen: torch.Generator) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per step, per microbatch: (images, labels) of the global batch, one label per image."""
    return [[(torch.randn(rows, CHANNELS, IMAGE, IMAGE, generator=gen), torch.randint(0, CLASSES, (rows,), generator=gen))
             for _ in range(structure["accum"])] for _ in range(structure["steps"])]
