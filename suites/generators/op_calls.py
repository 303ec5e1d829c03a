"""How each op of the ops inventory is called: the same code on full tensors and on DTensors.

One function per entry of distci/op_inventory.py (whose `where` names the trainer code each
call is written after; the second round's in op_calls_round2.py). A function takes the case's
inputs, its parameters and a Context (random tensors laid out like an input, for gradients an
optimizer step needs) and returns a tuple of tensors: the op's outputs. Nothing here knows
whether it runs on DTensors: that is the point.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .op_calls_round2 import ROUND_2_CALLS


class Context:
    """What an op call may need besides its inputs: `like(t, k)`, a seeded random tensor
    with t's shape and dtype, laid out as t is (a DTensor with t's placements for a DTensor)."""

    def __init__(self, like: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
        self.like = like


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in str(text).split(":"))


def _reduction(p: dict[str, Any]) -> str:
    """A loss's reduction: a case parsed from its id reads `none` back as None."""
    return "none" if p["reduction"] is None else p["reduction"]


def _dim_kw(p: dict[str, Any]) -> dict[str, Any]:
    return {} if p["dim"] is None else {"dim": p["dim"], "keepdim": bool(p["keepdim"])}


def _ord(p: dict[str, Any]) -> float:
    return float("inf") if p["ord"] == "inf" else float(p["ord"])


def _rotary(x, p, c):
    q, freqs = x
    cos, sin = freqs.cos().unsqueeze(0).unsqueeze(2), freqs.sin().unsqueeze(0).unsqueeze(2)
    half = q.shape[-1] // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return (q * cos + rotated * sin,)


def _rotary_complex(x, p, c):
    q, angles = x
    freqs_cis = torch.polar(torch.ones_like(angles), angles)  # precompute_freqs_cis
    q_ = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, q_.shape[1], 1, q_.shape[-1])  # reshape_for_broadcast
    return (torch.view_as_real(q_ * freqs_cis).flatten(3).type_as(q),)


def _repeat_kv(x, p, c):
    bs, slen, n_kv_heads, head_dim = x[0].shape
    n_rep = p["n_rep"]
    if n_rep == 1:
        return (x[0],)
    return (torch.unsqueeze(x[0], dim=3).expand(bs, slen, n_kv_heads, n_rep, head_dim)
            .reshape(bs, slen, n_kv_heads * n_rep, head_dim),)


def _router_aux_loss(x, p, c):
    gate_logits = x[0]
    num_experts = gate_logits.shape[-1]
    routing_weights = F.softmax(gate_logits, dim=-1)
    _, selected_experts = torch.topk(routing_weights, p["top_k"], dim=-1)
    expert_mask = F.one_hot(selected_experts, num_experts)
    tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    return (torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0)) * num_experts,)


def _kl_distill(x, p, c):
    student_logits, teacher_logits, labels = x
    teacher_prob = F.softmax(teacher_logits, dim=-1, dtype=torch.float32)
    inf_mask = torch.isinf(student_logits)
    student_logprob = F.log_softmax(student_logits, dim=-1, dtype=torch.float32)
    prod_probs = torch.masked_fill(teacher_prob * student_logprob, inf_mask, 0)
    per_token = torch.sum(prod_probs, dim=-1).view(-1)
    mask = (labels != -100).int()
    return (-torch.sum(per_token * mask.view(-1), dim=0) / torch.sum(mask.view(-1), dim=0),)


_POINTWISE_LOSSES = {
    "mse": F.mse_loss, "l1": F.l1_loss, "smooth_l1": F.smooth_l1_loss, "huber": F.huber_loss,
    "bce_logits": lambda a, b, reduction: F.binary_cross_entropy_with_logits(a, b.sigmoid(), reduction=reduction),
}


def _pointwise_loss(x, p, c):
    return (_POINTWISE_LOSSES[p["loss"]](x[0].float(), x[1].float(), reduction=p["reduction"]),)


def _softcap(x, p, c):
    logits = x[0] / p["cap"]
    return (torch.tanh(logits) * p["cap"],)


def _index_add(x, p, c):
    if not p["inplace"]:
        return (torch.index_add(x[0], 0, x[1], x[2].to(x[0].dtype)),)
    out = x[0].clone()
    out.index_add_(0, x[1], x[2].to(x[0].dtype))
    return (out,)


def _index_put(x, p, c):
    base, rows, values = x
    # torchtitan's _unpermute writes every row of a new_empty tensor; a mask-token write keeps
    # the activation's other rows (and its gradient)
    out = values.new_empty(base.shape) if p["base"] == "new_empty" else base.clone()
    out[rows, :] = values.to(out.dtype)
    return (out,)


def _swiglu_chunk(x, p, c):
    a, b = x[0].chunk(2, dim=-1)
    return (F.silu(a) * b,)


def _rms_manual(x, p, c):
    h = x[0].to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (x[1] * h.to(x[0].dtype),)


def _reduce(fn_all: Callable, fn_dim: Callable) -> Callable:
    return lambda x, p, c: (fn_all(x[0]) if p["dim"] is None else fn_dim(x[0], **_dim_kw(p)),)


def _view_heads(x, p, c):
    b, s, _ = x[0].shape
    y = x[0].view(b, s, -1, p["head_dim"])
    return (y.transpose(1, 2) if p["then"] == "transpose12" else y,)


def _clip(x, p, c):
    params = [t.detach().clone() for t in x]
    for i, t in enumerate(params):
        t.grad = c.like(t, i)
    total = torch.nn.utils.clip_grad_norm_(params, p["max_norm"], norm_type=_ord(p), foreach=True)
    return (total, *[t.grad for t in params])


def _optimizer(make: Callable, steps: int) -> Callable:
    def run(x, p, c):
        params = [t.detach().clone() for t in x]
        opt = make(params, p)
        for step in range(steps if steps else p["steps"]):
            for i, t in enumerate(params):
                t.grad = c.like(t, 10 * step + i)
            opt.step()
        return tuple(params)
    return run


def _loss_plus_aux(x, p, c):
    loss = x[0].float().logsumexp(-1).mean()
    aux = x[1].float().pow(2).sum() / max(x[1].numel(), 1)
    if p["inplace"]:
        loss += p["coef"] * aux
        return (loss,)
    return (loss + p["coef"] * aux,)


def _clamp(x, p, c):
    lo, hi = (None if v in (None, "none") else float(v) for v in (p["lo"], p["hi"]))  # a parsed id gives None
    if not p.get("inplace"):
        return (x[0].clamp(min=lo, max=hi),)
    out = _written(x[0])
    out.clamp_(min=lo, max=hi)
    return (out,)


def _amax_all(t):
    return torch.max(torch.abs(t))


def _written(t):
    """An activation to write in place, as autograd holds it (not a leaf) and in `t`'s placement:
    `t * 1.0` (a product by a scalar keeps a Partial one), not t.clone() (which replicates it)."""
    return t * 1.0


def _masked_fill(x, p, c):
    if not p.get("inplace"):
        return (x[0].masked_fill(x[1], p["value"]),)
    out = _written(x[0])
    out.masked_fill_(x[1], p["value"])
    return (out,)


_SCALAR_INPLACE: dict[str, Callable] = {
    "mul_": lambda t, v: t.mul_(v),
    "zero_": lambda t, v: t.zero_(),
    "fill_": lambda t, v: t.fill_(v),
    "div_": lambda t, v: t.div_(v),
    "add_": lambda t, v: t.add_(v),
    "sub_": lambda t, v: t.sub_(v),
    "clamp_": lambda t, v: t.clamp_(-abs(v), abs(v)),
    # the gradients a step overflowed (x / 0: +-inf, and nan where x is 0), sanitized
    "nan_to_num_": lambda t, v: t.div_(0.0).nan_to_num_(nan=0.0, posinf=abs(v), neginf=-abs(v)),
    "detach_zero_": lambda t, v: t.detach_().zero_(),
}
_TENSOR_INPLACE: dict[str, Callable] = {
    "lerp_": lambda t, o, w: t.lerp_(o, w),
    "copy_": lambda t, o, w: t.copy_(o),
    "add_": lambda t, o, w: t.add_(o, alpha=w),
    "sub_": lambda t, o, w: t.sub_(o, alpha=w),
    "mul_": lambda t, o, w: t.mul_(o),
    "addcmul_": lambda t, o, w: t.addcmul_(o, o, value=w),
}


def _inplace_scalar(x, p, c):
    # the input itself, as optimizers, scalers and EMA write parameters, gradients and buffers
    _SCALAR_INPLACE[p["op"]](x[0], p["value"])
    return (x[0],)


def _inplace_tensor(x, p, c):
    _TENSOR_INPLACE[p["op"]](x[0], x[1].to(x[0].dtype), p["weight"])
    return (x[0],)


INITS: dict[str, tuple[Callable, Callable[[tuple[int, ...]], float | None]]] = {
    # init -> (the call, the largest |value| it may write into a tensor of that full shape)
    "trunc_normal_": (lambda w: nn.init.trunc_normal_(w, mean=0.0, std=0.02, a=-0.04, b=0.04), lambda s: 0.04),
    "normal_": (lambda w: nn.init.normal_(w, 0.0, 0.02), lambda s: None),
    "uniform_": (lambda w: nn.init.uniform_(w, -0.1, 0.1), lambda s: 0.1),
    "kaiming_uniform_": (lambda w: nn.init.kaiming_uniform_(w, a=math.sqrt(5)),
                         lambda s: math.sqrt(2.0 / 6.0) * math.sqrt(3.0 / s[1])),
    "xavier_uniform_": (lambda w: nn.init.xavier_uniform_(w), lambda s: math.sqrt(6.0 / (s[0] + s[1]))),
}
"""The bound is read from the FULL shape (fan_in = size(1), fan_out = size(0) for a 2-D weight):
a sharded parameter must be initialized as the whole one would be (suites/generators/ops_random.py)."""


def _init(x, p, c):
    w = x[0].detach().clone()
    with torch.no_grad():
        INITS[p["init"]][0](w)
    return (w,)


_NOISE: dict[str, Callable] = {
    "randn_like": torch.randn_like,
    "rand_like": torch.rand_like,
    "bernoulli_": lambda t: t.new_empty(t.shape).bernoulli_(0.9),
}


def _lp_cross_entropy(x, p, c):
    logits, target, weight = x
    kw = {"weight": weight.float()} if p["weight"] else {}
    return (F.cross_entropy(logits.float(), target, ignore_index=-100, reduction=_reduction(p),
                            label_smoothing=p["label_smoothing"], **kw),)


def _lp_chunked_ce(x, p, c):
    logits, labels = x  # torchtune: the model's output chunks over the sequence, one CE sum each
    chunks = [t.reshape(-1, t.shape[-1]) for t in logits.chunk(p["chunks"], dim=1)]
    targets = [t.reshape(-1) for t in labels.chunk(p["chunks"], dim=1)]
    total = sum(F.cross_entropy(a.float(), b, ignore_index=-100, reduction="sum") for a, b in zip(chunks, targets))
    return (total / (labels != -100).sum(),)


def _lp_z_loss(x, p, c):
    logits, labels = x
    ce = F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")
    z_squared = logits.float().logsumexp(-1).pow(2)
    return (ce + p["coef"] * (z_squared * (labels != -100)).sum(),)


def _lp_soft_ce(x, p, c):
    logits, raw = x
    target = raw.float().softmax(-1)  # probabilities (mixup / a teacher's), vocab-sharded as the logits
    if p["how"] == "probs":
        return (F.cross_entropy(logits.float(), target),)
    return (torch.sum(-target * F.log_softmax(logits.float(), dim=-1), dim=-1).mean(),)


def _lp_kl_div(x, p, c):
    student, teacher = x
    t = p["temperature"]
    return (F.kl_div(F.log_softmax(student.float() / t, dim=-1), F.softmax(teacher.float() / t, dim=-1),
                     reduction="batchmean") * t * t,)


def _lp_logprobs(x, p, c):
    logits, labels, mask = x
    index = labels.unsqueeze(-1)
    if p["how"] == "gather":  # torchtune / DPO: log_softmax, then the labels' entries
        logps = torch.gather(logits.float().log_softmax(-1), 2, index).squeeze(-1)
    else:  # TRL selective_log_softmax (its row loop written as one logsumexp)
        logps = torch.gather(logits.float(), 2, index).squeeze(-1) - torch.logsumexp(logits.float(), dim=-1)
    return ((logps * mask).sum(-1),)


def _value_loss(x, p, c):
    vpred, v_old, returns, mask = x
    m = mask.float()
    if p["loss"] == "clipped_mse":  # PPO: the prediction kept within clip of the old value
        clipped = v_old + (vpred - v_old).clamp(-p["clip"], p["clip"])
        per_token = torch.max((vpred - returns) ** 2, (clipped - returns) ** 2)
    elif p["loss"] == "huber":
        per_token = F.huber_loss(vpred, returns, reduction="none")
    else:
        per_token = (vpred - returns) ** 2
    return (0.5 * (per_token * m).sum() / m.sum(),)  # TRL masked_mean over the response tokens


CALLS: dict[str, Callable[[list, dict, Context], tuple]] = {
    "linear": lambda x, p, c: (F.linear(x[0], x[1], x[2] if p["bias"] else None),),
    "matmul": lambda x, p, c: (torch.matmul(x[0], x[1]),),
    "addmm": lambda x, p, c: (torch.addmm(x[0], x[1], x[2]),),
    "bmm": lambda x, p, c: (torch.bmm(x[0], x[1]),),
    "einsum": lambda x, p, c: (torch.einsum(p["eq"].replace(".", ",").replace("-", "->"), x[0], x[1]),),
    "conv2d_patch": lambda x, p, c: (F.conv2d(x[0], x[1], x[2], stride=p["stride"]),),
    "embedding": lambda x, p, c: (F.embedding(x[0], x[1]),),
    "cross_entropy": lambda x, p, c: (F.cross_entropy(x[0].float(), x[1], ignore_index=-100, reduction=_reduction(p),
                                                      label_smoothing=p["label_smoothing"]),),
    "nll_log_softmax": lambda x, p, c: (F.nll_loss(F.log_softmax(x[0].float(), dim=-1), x[1], ignore_index=-100),),
    "logprobs_gather": lambda x, p, c: (torch.gather(x[0].log_softmax(-1), 2, x[1].unsqueeze(-1)).squeeze(-1),),
    "softmax": lambda x, p, c: (F.softmax(x[0], dim=p["dim"], dtype=torch.float32),),
    "log_softmax": lambda x, p, c: (F.log_softmax(x[0], dim=p["dim"]),),
    "loss_plus_aux": _loss_plus_aux,
    "sigmoid": lambda x, p, c: (torch.sigmoid(x[0].to(torch.float32)),),
    "layer_norm": lambda x, p, c: (F.layer_norm(x[0], (x[0].shape[-1],), x[1], x[2]),),
    "rms_norm": lambda x, p, c: (F.rms_norm(x[0], (x[0].shape[-1],), x[1], eps=1e-6),),
    "rms_norm_manual": _rms_manual,
    "sdpa": lambda x, p, c: (F.scaled_dot_product_attention(x[0], x[1], x[2], is_causal=bool(p["is_causal"])),),
    "rotary": _rotary,
    "rotary_complex": _rotary_complex,
    "repeat_kv": _repeat_kv,
    "router_aux_loss": _router_aux_loss,
    "kl_distill": _kl_distill,
    "pointwise_loss": _pointwise_loss,
    "softcap": _softcap,
    "index_add": _index_add,
    "gelu": lambda x, p, c: (F.gelu(x[0], approximate=p["approximate"]),),
    "silu": lambda x, p, c: (F.silu(x[0]),),
    "swiglu": lambda x, p, c: (F.silu(x[0]) * x[1],),
    "swiglu_chunk": _swiglu_chunk,
    "dropout_eval": lambda x, p, c: (F.dropout(x[0], p=p["p"], training=False),),
    "sum": _reduce(torch.sum, torch.sum),
    "mean": _reduce(torch.mean, torch.mean),
    "amax": _reduce(_amax_all, torch.amax),
    "vector_norm": lambda x, p, c: (torch.linalg.vector_norm(x[0], _ord(p), **_dim_kw(p)),),
    "foreach_norm": lambda x, p, c: tuple(torch._foreach_norm(list(x), _ord(p))),
    "clip_grad_norm": _clip,
    "view_heads": _view_heads,
    "flatten01": lambda x, p, c: (x[0].flatten(0, 1),),
    "transpose": lambda x, p, c: (x[0].transpose(*_ints(p["dims"])),),
    "permute": lambda x, p, c: (x[0].permute(*_ints(p["perm"])),),
    "reshape_merge": lambda x, p, c: (x[0].reshape(x[0].shape[0], x[0].shape[1], -1),),
    "unsqueeze_expand": lambda x, p, c: (x[0].reshape(-1, 1).expand(-1, p["to"]),),
    "cat": lambda x, p, c: (torch.cat([x[0], x[1]], dim=p["dim"]),),
    "stack": lambda x, p, c: (torch.stack([x[0], x[1]], dim=int(p["dim"])),),
    "split": lambda x, p, c: tuple(x[0].split(p["size"], dim=p["dim"])),
    "chunk": lambda x, p, c: tuple(x[0].chunk(p["chunks"], dim=p["dim"])),
    "unbind": lambda x, p, c: tuple(x[0].unbind(p["dim"])),
    "index_select": lambda x, p, c: (x[0].index_select(0, x[1]),),
    "gather": lambda x, p, c: (x[0].gather(1, x[1]),),
    "index_put": _index_put,
    "scatter_add": lambda x, p, c: (x[0].scatter_add(0, x[1], x[2]),),
    "topk": lambda x, p, c: tuple(torch.topk(x[0], p["k"], dim=int(p["dim"]))),
    "argmax": lambda x, p, c: (x[0].argmax(dim=p["dim"]),),
    "argsort": lambda x, p, c: (torch.argsort(x[0], stable=True),),
    "cumsum": lambda x, p, c: (torch.cumsum(x[0], dim=p["dim"]),),
    "where": lambda x, p, c: (torch.where(x[0], x[1], x[2]),),
    "masked_fill": _masked_fill,
    "clamp": _clamp,
    "pow_rsqrt": lambda x, p, c: (torch.rsqrt(x[0].pow(p["exp"]) + 1e-6),),
    "to_dtype": lambda x, p, c: (x[0].to(getattr(torch, p["to"])),),
    "adamw_foreach": _optimizer(lambda ps, p: torch.optim.AdamW(ps, lr=1e-2, weight_decay=p["weight_decay"],
                                                                 foreach=True), 0),
    "sgd_foreach": _optimizer(lambda ps, p: torch.optim.SGD(ps, lr=0.1, momentum=p["momentum"], foreach=True), 2),
    "inplace_scalar": _inplace_scalar,
    "inplace_tensor": _inplace_tensor,
    "dropout_train": lambda x, p, c: (F.dropout(x[0], p=p["p"], training=True),),
    "init_": _init,
    "rand_like": lambda x, p, c: (_NOISE[p["kind"]](x[0]),),
    "lp_cross_entropy": _lp_cross_entropy,
    "lp_nll_log_softmax": lambda x, p, c: (F.nll_loss(F.log_softmax(x[0].float(), dim=-1), x[1], ignore_index=-100,
                                                      reduction=_reduction(p)),),
    "lp_chunked_ce": _lp_chunked_ce,
    "lp_z_loss": _lp_z_loss,
    "lp_soft_ce": _lp_soft_ce,
    "lp_kl_div": _lp_kl_div,
    "lp_logprobs": _lp_logprobs,
    "value_loss": _value_loss,
    **ROUND_2_CALLS,
}
