"""How the ops of the inventory's second round are called (distci/op_inventory.py ROUND_2).

The same contract as suites/generators/op_calls.py, which merges these into its CALLS: one
function per entry, written as the file its `where` names writes the call, taking the case's
inputs, parameters and Context and returning the op's outputs, never knowing whether it runs
on DTensors. Self-contained (op_calls imports it, so it imports nothing of op_calls).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

FLOAT8_MAX = 448.0
"""torch.finfo(torch.float8_e4m3fn).max: torchao's scale numerator (a literal: the scale math is the
point, not the float8 dtype, which a CPU mesh need not have kernels for)."""
EPS = 1e-12
"""torchao/float8/float8_utils.py EPS: the amax clamp before the division."""


def _dims(text: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in str(text).split(":"))


def _index(ndim: int, dim: int, item: slice) -> tuple:
    return (slice(None),) * (dim % ndim) + (item,)


def _clip_loss(x, p, c):
    image, text, labels = x  # open_clip ClipLoss, one rank's view of the whole batch
    image, text = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
    logits_per_image = p["scale"] * image @ text.T
    logits_per_text = p["scale"] * text @ image.T
    return ((F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2,)


def _var(x, p, c):
    kw: dict[str, Any] = {"correction": p["correction"]}
    if p["dim"] is not None:
        kw.update(dim=p["dim"], keepdim=bool(p["keepdim"]))
    if p["how"] == "var_mean":
        return tuple(torch.var_mean(x[0], **kw))
    return ((torch.var if p["how"] == "var" else torch.std)(x[0], **kw),)


def _logsumexp(x, p, c):
    lse = torch.logsumexp(x[0], dim=p["dim"], keepdim=bool(p["keepdim"]))
    if p["then"] == "z_loss":  # switch transformers: squared, summed over tokens, over their count
        return (torch.sum(lse ** 2) / max(lse.numel(), 1),)
    return (lse,)


def _causal_conv1d(x, p, c):
    h, weight, bias = x  # Mamba's depthwise causal conv: pad K-1 both sides, keep the first L
    return (F.conv1d(h, weight, bias, padding=weight.shape[-1] - 1, groups=h.shape[1])[..., :h.shape[-1]],)


def _slice(x, p, c):
    stop = None if p["stop"] in (None, "none") else int(p["stop"])
    return (x[0][_index(x[0].ndim, p["dim"], slice(p["start"], stop, p["step"]))],)


def _roll(x, p, c):
    dims = _dims(p["dims"])
    return (torch.roll(x[0], shifts=(p["shift"],) * len(dims), dims=dims),)


def _tril(x, p, c):
    if p["how"] == "causal_fill":  # a mask the scores' size, built from them, then the fill
        keep = torch.ones_like(x[0], dtype=torch.bool).tril(diagonal=p["diagonal"])
        return (x[0].masked_fill(~keep, -1e4),)
    return ((torch.tril if p["how"] == "tril" else torch.triu)(x[0], diagonal=p["diagonal"]),)


def _position_ids(x, p, c):
    mask = x[0].long()
    positions = mask.cumsum(-1) - 1
    positions.masked_fill_(mask == 0, 1)
    return (positions,)


def _count_tokens(x, p, c):
    flat = x[0].view(-1)
    if p["how"] == "bincount":
        return (torch.bincount(flat, minlength=p["bins"]),)
    return (torch.histc(flat.float(), bins=p["bins"], min=0, max=p["bins"]),)


def _unflatten_heads(x, p, c):
    y = x[0].unflatten(-1, (p["heads"], -1))
    if p["then"] == "transpose12":
        return (y.transpose(1, 2),)
    if p["then"] == "flatten23":  # back after attention
        return (y.flatten(2, 3),)
    return (y,)


def _interpolate(x, p, c):
    mode = p["mode"].removesuffix("_aa")
    size = (p["size"], p["size"])
    if mode == "nearest":
        return (F.interpolate(x[0].float(), size=size, mode=mode),)
    return (F.interpolate(x[0].float(), size=size, mode=mode, antialias=p["mode"].endswith("_aa"),
                          align_corners=False),)


def _aminmax(x, p, c):
    if p["dim"] is None:
        return tuple(torch.aminmax(x[0]))
    return tuple(torch.aminmax(x[0], dim=p["dim"], keepdim=bool(p["keepdim"])))


def _fp8_scale(x, p, c):
    hp = x[0]
    with torch.no_grad():  # the scale never carries a gradient (the entry has no backward: op_inventory)
        amax = torch.max(torch.abs(hp)) if p["granularity"] == "tensorwise" else \
            torch.amax(torch.abs(hp), dim=-1, keepdim=True)
        scale = (FLOAT8_MAX / torch.clamp(amax.to(torch.float64), min=EPS)).to(torch.float32)
    scaled = (hp.to(torch.float32) * scale).clamp(min=-FLOAT8_MAX, max=FLOAT8_MAX)
    return (scaled, scale.reciprocal())


def _nonfinite(x, p, c):
    grads = x[0].masked_fill(x[1], float("inf")) if p["poison"] else x[0] * 1.0
    if p["how"] == "isfinite_all":
        return (torch.isfinite(grads).all(),)
    if p["how"] == "isinf_any":
        return (torch.isinf(grads).any(),)
    # GradScaler's own: plain float32 found_inf and inv_scale beside the (DTensor) gradients, found_inf
    # read back with .item() by scaler.step (DTensor reduces it over the mesh: found_inf_reduce_handler)
    found_inf = torch.zeros((), dtype=torch.float32, device=grads.device)
    inv_scale = torch.full((), 0.5, dtype=torch.float32, device=grads.device)
    torch._amp_foreach_non_finite_check_and_unscale_([grads], found_inf, inv_scale)
    return (grads, grads.new_full((), found_inf.item(), dtype=torch.float32))


def _dpo_loss(x, p, c):
    policy_chosen, policy_rejected, ref_chosen, ref_rejected = x
    logits = (policy_chosen - policy_rejected) - (ref_chosen - ref_rejected)
    beta, smoothing = p["beta"], 0.1
    if p["loss"] == "sigmoid":
        losses = -F.logsigmoid(beta * logits)
    elif p["loss"] == "robust":
        losses = (-F.logsigmoid(beta * logits) * (1 - smoothing) + F.logsigmoid(-beta * logits) * smoothing) / (
            1 - 2 * smoothing)
    elif p["loss"] == "hinge":
        losses = torch.relu(1 - beta * logits)
    else:
        losses = (logits - 1 / (2 * beta)) ** 2
    return (losses.mean(),)


ROUND_2_CALLS: dict[str, Callable[[list, dict, Any], tuple]] = {
    "normalize": lambda x, p, c: (F.normalize(x[0], dim=p["dim"]),),
    "clip_loss": _clip_loss,
    "cosine_similarity": lambda x, p, c: (F.cosine_similarity(x[0], x[1], dim=int(p["dim"])),),
    "var": _var,
    "group_norm": lambda x, p, c: (F.group_norm(x[0], p["groups"], x[1], x[2]),),
    "logsumexp": _logsumexp,
    "pad": lambda x, p, c: (F.pad(x[0], _dims(p["pad"]), value=p["value"]),),
    "causal_conv1d": _causal_conv1d,
    "slice": _slice,
    "roll": _roll,
    "flip": lambda x, p, c: (x[0].flip([p["dim"]]),),
    "tril": _tril,
    "position_ids": _position_ids,
    "one_hot": lambda x, p, c: (F.one_hot(x[0], num_classes=p["classes"]),),
    "count_tokens": _count_tokens,
    "sort": lambda x, p, c: tuple(torch.sort(x[0], dim=p["dim"], descending=bool(p["descending"]), stable=True)),
    "cumprod": lambda x, p, c: (torch.cumprod(x[0], dim=p["dim"]),),
    "unflatten_heads": _unflatten_heads,
    "baddbmm": lambda x, p, c: (x[0].baddbmm(batch1=x[1], batch2=x[2], beta=p["beta"], alpha=p["alpha"]),),
    "outer": lambda x, p, c: (torch.outer(x[0], x[1]),),
    "repeat_interleave": lambda x, p, c: (x[0].repeat_interleave(p["n_rep"], dim=int(p["dim"])),),
    "interpolate": _interpolate,
    "aminmax": _aminmax,
    "fp8_scale": _fp8_scale,
    "nonfinite": _nonfinite,
    "dpo_loss": _dpo_loss,
    "softplus": lambda x, p, c: (F.softplus(x[0], beta=p["beta"]),),
}
