"""The ops the generator draws: what models, losses and training loops call, and where.

Entries come in rounds (`ROUNDS`: the transformer step's ops, then what models, losses and
training loops call beyond it), a widening a new round, so it moves only the case indices it
takes (distci/fuzz/ops.py). Each entry names the trainer code that calls the op (`where`, built
from distci/op_sources.py), the tensor inputs as shape templates over named size variables,
and the op's parameters with their choices (the first is the simplest: the shrinker moves
toward it). The cell side (suites/generators/op_calls.py) holds one small function per entry
that calls the op the way that code calls it; an entry without one is a test failure
(tests/test_fuzz_ops.py).

A shape template is a space-separated list of dims: a size variable (`M`), an optional
one (`B?`: present or absent, drawn per case, dropped first when shrinking), or a product
(`H*D`: the dim a view splits). An input's `kind`:
  float     random normal values (the drawn dtype), differentiable when `grad`
  pos       positive floats (for rsqrt, log): |x| + 0.5
  distinct  distinct floats (for topk / argmax / argsort: no tie decides an index)
  index:V   int64 in [0, V)
  perm:V    int64, a permutation of range(V) (its first entries): distinct rows, as MoE token
            permutations are
  target:V  int64 in [0, V), about one in five set to -100 (ignore_index, as loss code pads)
  mask      bool
Param values never hold `,` or `~` (a case id joins them): an einsum equation writes
`.` between operands and `-` for `->`, dims lists `:`.
Param choices given as a string are drawn from the case: `dim:<i>` a dim of input i
(negative ones too, as trainers write dim=-1), `dim?:<i>` that or None (all dims),
`var:<V>` the size of variable V (a factor of a product dim the op needs to know).

Forms (`OpSpec.forms`) are choices drawn from a second random stream, the first the plain
form: a case's id names a form only when it is not the plain one, so widening the inventory
by a form never moves what a seed drew before (the plants' seeds, a replayed night), and a
form shrinks to the plain one by leaving the id. `USE` is the form every entry whose call
returns several differentiable outputs carries (tests/test_fuzz_redteam.py checks that): the
loss reads them all, or only the first, as `q, _ = x.split(...)` and a metric-only output
do (the others' gradients never exist: autograd hands the op's backward zeros it made itself).
`INPLACE` is the form of an out-of-place entry whose callers also write it in place (`masked_fill_`,
`clamp_`): DTensor's named refusal of that write is then a gap, as for `OpSpec.inplace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from distci.op_sources import (
    TITAN_LLAMA, TITAN_MOE, TITAN_LOSS, TITAN_CLIP, TUNE_CE, TUNE_DPO, HF_LLAMA, HF_GPT2, HF_TRAINER, OPTIM,
    HF_VIT, HF_MIXTRAL, HF_MIXTRAL_AUX, HF_MIXTRAL_MOE, HF_GEMMA2, TUNE_KD, TITAN_FLUX, TIMM_VIT, TITAN_EP,
    MASK_TOKENS, HF_SEQ_CLS, ZERO_GRAD, GRAD_SCALER, ACCUM, EMA, LOAD_STATE, ADAM_SINGLE, CLIP_LOGIT,
    SANITIZE, TITAN_INIT, HF_INIT, HF_DROPOUT, TITAN_LP, TUNE_CHUNKED, TRL_LOGPS, ZLOSS, HF_KD, TIMM_SOFT,
    TRL_VALUE, NOISE, OPEN_CLIP, COSINE, TIMM_STATS, DIFFUSERS_RESNET, ROUTER_Z, HF_MAMBA, SWIN, MASKS, HF_ONE_HOT,
    TITAN_HISTC, HF_TOP_P, DDPM, VIM_FLIP, DIFFUSERS_HEADS, HF_BLOOM, TITAN_FREQS, GQA_INTERLEAVE, TIMM_POSEMB,
    AO_OBSERVER, AO_FLOAT8, FOUND_INF, TRL_DPO, HF_POSITIONS,
)


@dataclass(frozen=True)
class Arg:
    dims: str
    kind: str = "float"
    grad: bool = True


@dataclass(frozen=True)
class OpSpec:
    name: str
    args: tuple[Arg, ...]
    where: str
    params: dict[str, tuple | str] = field(default_factory=dict)
    dtypes: tuple[str, ...] = ("f32", "bf16")
    mins: dict[str, int] = field(default_factory=dict)
    """Smallest size of a variable (a vocabulary of 0 has no valid index)."""
    grad: bool = True
    """False: no backward (index outputs only, optimizer updates under no_grad)."""
    forms: dict[str, tuple] = field(default_factory=dict)
    """Param choices drawn from the forms stream (module docstring), the first the plain form."""
    inplace: bool = False
    """The call is an in-place write the caller itself wrote (`out[idx] = v`): DTensor's refusal
    to change the written tensor's placement is a gap the caller can act on, as for `inplace=1`."""
    context: str = ""
    """"loss_parallel": the DTensor side runs the call and its backward under
    torch.distributed.tensor.parallel.loss_parallel(), on inputs laid out as a TP run with loss
    parallel leaves them (`loss_parallel_layout`); the reference is the plain call."""
    random: bool = False
    """The op draws random numbers (dropout, init, *_like): no single-device value to equal, so it
    is judged by the properties DTensor promises (suites/generators/ops_random.py)."""


LP_MINS = {"V": 2}
"""A loss-parallel entry's classes: at least 2, so the 2-way tp axis (meshes 2 and 2x2) never holds
an empty class shard, where every rank deadlocks (dtensor-loss-parallel-empty-class-shard, registered)
and each case costs a resume slot; the 4-way mesh still draws it (3 classes: 1, 1, 1, 0)."""
USE = {"use": ("all", "first")}
"""Which outputs the loss reads: every one, or the first only (the module docstring)."""
INPLACE = {"inplace": (0, 1)}
"""The out-of-place call, or the caller's own in-place one (`x.clamp_(...)` on a clone of the input)."""


def _a(dims: str, kind: str = "float", grad: bool = True) -> Arg:
    return Arg(dims, kind, grad)


def _unary(name: str, where: str, dims: str = "B? M N", kind: str = "float", **kw: Any) -> OpSpec:
    return OpSpec(name, (_a(dims, kind),), where, **kw)


ROUND_1: tuple[OpSpec, ...] = (
    # matmuls: every projection, attention score, expert loop
    OpSpec("linear", (_a("B? M K"), _a("N K"), _a("N")), f"{TITAN_LLAMA} (nn.Linear: wq/wk/wv/wo, w1/w2/w3, output)",
           {"bias": (1, 0)}),
    OpSpec("matmul", (_a("B? M K"), _a("K N")), f"{TITAN_MOE} (_run_experts_for_loop: torch.matmul(x, w.transpose))"),
    OpSpec("addmm", (_a("N"), _a("M K"), _a("K N")), f"{HF_GPT2} (torch.addmm(bias, x.view(-1, nx), weight))"),
    OpSpec("bmm", (_a("B M K"), _a("B K N")), f"{HF_LLAMA} (batched attention scores), {TITAN_MOE} experts"),
    OpSpec("einsum", (_a("B H S E"), _a("B H T E")), "transformers rotary / attention einsum ('bhqd,bhkd->bhqk')",
           {"eq": ("bhqd.bhkd-bhqk", "bhqd.bhkd-bqhk")}),
    OpSpec("conv2d_patch", (_a("B? C H*2 W*2"), _a("O C 2 2"), _a("O")),
           f"{HF_VIT}, CLIP / SigLIP vision towers, torchtitan's flux autoencoder (nn.Conv2d)",
           {"stride": (2, 1)}, mins={"C": 1}),
    OpSpec("embedding", (_a("B? M", "index:V", grad=False), _a("V D")), f"{TITAN_LLAMA} (tok_embeddings)",
           mins={"V": 1}),
    # losses
    OpSpec("cross_entropy", (_a("M V"), _a("M", "target:V", grad=False)),
           f"{TITAN_LOSS} (cross_entropy_loss: pred.flatten(0, 1).float()), {TUNE_CE} (ignore_index=-100), "
           f"{HF_TRAINER} (label smoothing)",
           {"reduction": ("mean", "sum", "none"), "label_smoothing": (0.0, 0.1)}, mins={"V": 1}),
    OpSpec("nll_log_softmax", (_a("M V"), _a("M", "target:V", grad=False)),
           "torchtune/modules/loss (F.nll_loss(F.log_softmax(x, -1), y, ignore_index=-100))", mins={"V": 1}),
    OpSpec("logprobs_gather", (_a("B S V"), _a("B S", "index:V", grad=False)),
           f"{TUNE_DPO} (torch.gather(logits.log_softmax(-1), 2, labels.unsqueeze(-1)).squeeze(-1))", mins={"V": 1}),
    _unary("softmax", f"{HF_LLAMA} (eager attention: softmax(dim=-1, dtype=float32)), "
           f"{TITAN_MOE} (router softmax dim=1)",
           params={"dim": "dim:0"}),
    _unary("log_softmax", f"{TUNE_DPO}, torchtitan/models/*/generate (log_softmax(-1))", params={"dim": "dim:0"}),
    OpSpec("loss_plus_aux", (_a("M V"), _a("M E")),
           f"{HF_MIXTRAL}, {TITAN_MOE} (load-balance loss added to the LM loss), z-loss terms: a scalar loss "
           "built by reductions, scaled and added in place",
           {"coef": (0.01, 1.0), "inplace": (1, 0)}),
    _unary("sigmoid", f"{TITAN_MOE} (router: torch.sigmoid(scores.to(torch.float32)))"),
    OpSpec("router_aux_loss", (_a("M E", "distinct"),),
           f"{HF_MIXTRAL_AUX} (softmax, topk, F.one_hot(selected_experts, num_experts).float() averaged over "
           "tokens, times the mean routing weight, summed, times num_experts)",
           {"top_k": (2, 1)}, dtypes=("f32",), mins={"E": 2}),
    OpSpec("kl_distill", (_a("M V"), _a("M V", grad=False), _a("M", "target:V", grad=False)),
           f"{TUNE_KD} (softmax(teacher, float32) * log_softmax(student, float32), masked_fill(isinf(student), 0), "
           "summed over the vocabulary, masked by labels != -100, divided by the count)", mins={"V": 1}),
    OpSpec("pointwise_loss", (_a("B? M N"), _a("B? M N", grad=False)),
           f"{TITAN_FLUX}, {HF_SEQ_CLS}, box-regression heads (F.smooth_l1_loss / F.huber_loss), "
           "F.l1_loss; bce_logits takes the target's sigmoid (probabilities)",
           {"loss": ("mse", "l1", "smooth_l1", "huber", "bce_logits"), "reduction": ("mean", "sum")}),
    # norms
    OpSpec("layer_norm", (_a("B? M D"), _a("D"), _a("D")), "nn.LayerNorm (torchtitan flux / HF GPT-2 ln_f)"),
    OpSpec("rms_norm", (_a("B? M D"), _a("D")), f"{TITAN_LLAMA} (nn.RMSNorm: attention_norm, ffn_norm, norm)"),
    OpSpec("rms_norm_manual", (_a("B? M D"), _a("D")),
           f"{HF_LLAMA} (LlamaRMSNorm: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)), torchtune RMSNorm"),
    # attention
    OpSpec("sdpa", (_a("B H S E"), _a("B H T E"), _a("B H T E")),
           f"{TITAN_LLAMA} (ScaledDotProductAttention: F.scaled_dot_product_attention(q, k, v, is_causal=True))",
           {"is_causal": (0, 1)}, mins={"E": 1}),
    OpSpec("rotary", (_a("B S H D2*2"), _a("S D2*2")),
           f"{HF_LLAMA} (apply_rotary_pos_emb: q * cos + rotate_half(q) * sin; rotate_half = cat(-x2, x1))"),
    OpSpec("rotary_complex", (_a("B S H D2*2"), _a("S D2", grad=False)),
           f"{TITAN_LLAMA} (precompute_freqs_cis: torch.polar; apply_rotary_emb: view_as_complex(xq.float()"
           ".reshape(..., -1, 2)) * freqs_cis, view_as_real(...).flatten(3).type_as(xq))"),
    OpSpec("repeat_kv", (_a("B S H D"),), f"{TITAN_LLAMA} (repeat_kv: unsqueeze(x, 3).expand(bs, slen, "
           "n_kv_heads, n_rep, head_dim).reshape(bs, slen, n_kv_heads * n_rep, head_dim): GQA)",
           {"n_rep": (2, 1, 3)}),
    # activations
    _unary("gelu", "transformers GPT-2 / BERT MLP (F.gelu, approximate='tanh' in gelu_new)",
           params={"approximate": ("none", "tanh")}),
    _unary("silu", f"{TITAN_LLAMA} (FeedForward: F.silu(w1(x)))"),
    OpSpec("swiglu", (_a("B? M N"), _a("B? M N")), f"{TITAN_LLAMA} (FeedForward: F.silu(w1(x)) * w3(x))"),
    OpSpec("swiglu_chunk", (_a("B? M N*2"),), "fused w13 projections (x1, x3 = h.chunk(2, dim=-1); silu(x1) * x3)"),
    _unary("softcap", f"{HF_GEMMA2} (logits / cap; torch.tanh(logits); logits * cap)",
           params={"cap": (30.0, 1.0)}),
    _unary("dropout_eval", "every model's dropout in eval (F.dropout(x, p, training=False))", params={"p": (0.1, 0.0)}),
    # reductions
    _unary("sum", f"{TITAN_LOSS} (sum reductions), torchtune per-token loss sums",
           params={"dim": "dim?:0", "keepdim": (0, 1)}),
    _unary("mean", f"{HF_LLAMA} (variance = x.pow(2).mean(-1, keepdim=True)), loss means",
           params={"dim": "dim?:0", "keepdim": (0, 1)}),
    _unary("amax", "torchao/float8/float8_utils.py (amax = torch.max(torch.abs(x)) / amax over dim for rowwise)",
           params={"dim": "dim?:0", "keepdim": (0, 1)}),
    _unary("vector_norm", f"{TITAN_CLIP} (torch.linalg.vector_norm(torch.stack(norms), norm_type))",
           params={"ord": (2, "inf"), "dim": "dim?:0", "keepdim": (0, 1)}),
    OpSpec("foreach_norm", (_a("M N", grad=False), _a("K", grad=False)),
           f"{TITAN_CLIP} + torch/nn/utils/clip_grad.py (torch._foreach_norm(grads, norm_type))",
           {"ord": (2, "inf")}, grad=False),
    OpSpec("clip_grad_norm", (_a("M N", grad=False), _a("K", grad=False)),
           f"{TITAN_CLIP} (clip_grads_with_norm_ / torch.nn.utils.clip_grad_norm_(foreach=True))",
           {"max_norm": (1.0, 0.01), "ord": (2, "inf")}, grad=False),
    # views
    OpSpec("view_heads", (_a("B S H*D"),), f"{TITAN_LLAMA} (Attention: xq.view(bs, seqlen, -1, head_dim))",
           {"head_dim": "var:D", "then": ("none", "transpose12")}),
    _unary("flatten01", f"{TITAN_LOSS} (pred.flatten(0, 1))", dims="B M N"),
    _unary("transpose", f"{TITAN_LLAMA} (xq.transpose(1, 2)), {TITAN_MOE} (w.transpose(-2, -1))", dims="B M N",
           params={"dims": ("1:2", "-2:-1", "0:1")}),
    _unary("permute", "HF attention (permute(0, 2, 1, 3)), torchtune kv caches", dims="B S H D",
           params={"perm": ("0:2:1:3", "1:0:2:3", "3:2:1:0")}),
    _unary("reshape_merge", f"{TITAN_LLAMA} (output.view(bs, seqlen, -1) after attention)", dims="B S H D"),
    _unary("unsqueeze_expand", f"{TITAN_MOE} (token_indices.reshape(-1, 1).expand(-1, dim))", dims="M",
           params={"to": (3, 1, 5)}),
    # joins and splits
    OpSpec("cat", (_a("M N"), _a("M N")), f"{HF_LLAMA} (rotate_half: torch.cat((-x2, x1), dim=-1)), {TITAN_MOE} "
           "(torch.cat(out_experts_splits, dim=0))", {"dim": "dim:0"}),
    OpSpec("stack", (_a("M N"), _a("M N")), f"{TITAN_CLIP} (torch.stack(norms))", {"dim": ("0", "-1", "1")}),
    _unary("split", "qkv / w13 splits (x.split([n1, n2], dim=-1))", params={"size": (1, 2, 3), "dim": "dim:0"},
           forms=USE),
    _unary("chunk", "fused-projection chunks (h.chunk(2, dim=-1)), pipeline microbatches (x.chunk(n))",
           params={"chunks": (2, 1, 3, 4), "dim": "dim:0"}, forms=USE),
    _unary("unbind", f"{TIMM_VIT}, stacked qkv / experts (x.unbind(dim))", dims="T M N",
           params={"dim": "dim:0"}, forms=USE),
    # indexing
    OpSpec("index_select", (_a("V D"), _a("J", "index:V", grad=False)), f"{TITAN_MOE} (top_scores.view(-1)[indices]), "
           "embedding-style lookups (weight.index_select(0, ids))", mins={"V": 1}),
    OpSpec("gather", (_a("M V"), _a("M J", "index:V", grad=False)), f"{TITAN_MOE} (scores.gather(dim=1, index=...))",
           mins={"V": 1}),
    OpSpec("index_add", (_a("V D"), _a("J", "index:V", grad=False), _a("J D")),
           f"{HF_MIXTRAL_MOE} (final_hidden_states.index_add_(0, top_x, current_hidden_states)); "
           "inplace=0: torch.index_add", {"inplace": (1, 0)}, mins={"V": 1}),
    OpSpec("index_put", (_a("V D"), _a("V", "perm:V", grad=False), _a("V D")),
           f"{TITAN_EP}; {MASK_TOKENS} (base=clone: the written tensor has a gradient too)",
           {"base": ("new_empty", "clone")}, inplace=True),
    OpSpec("scatter_add", (_a("V D"), _a("J D", "index:V", grad=False), _a("J D")),
           f"{TITAN_MOE} (out.scatter_add(dim=0, index=token_indices, src=routed_output))", mins={"V": 1}),
    _unary("topk", f"{TITAN_MOE} (torch.topk(scores, k=top_k, dim=1))", dims="M N", kind="distinct",
           params={"k": (1, 2, 3), "dim": ("-1", "0")}, dtypes=("f32",)),
    _unary("argmax", "accuracy metrics and greedy generation (logits.argmax(dim=-1))", dims="B? M N", kind="distinct",
           params={"dim": "dim:0"}, dtypes=("f32",), grad=False),
    _unary("argsort", f"{TITAN_MOE} (torch.argsort(selected_experts_indices.view(-1), stable=True))", dims="M",
           kind="distinct", dtypes=("f32",), grad=False),
    _unary("cumsum", f"{TITAN_MOE} (offsets = torch.cumsum(num_tokens_per_expert, dim=0))",
           params={"dim": "dim:0"}),
    # elementwise with masks and clamps
    OpSpec("where", (_a("M N", "mask", grad=False), _a("M N"), _a("M N")),
           "HF masking utils (torch.where(mask, x, min))"),
    OpSpec("masked_fill", (_a("B? M N"), _a("M N", "mask", grad=False)),
           "HF eager attention (scores.masked_fill(mask, finfo.min)), torchtune padding masks; inplace=1: "
           "scores.masked_fill_(mask, value) (GPT-2 / BERT-era attention, torch/nn/functional.py label smoothing)",
           {"value": (-10000.0, 0.0)}, forms=INPLACE),
    _unary("clamp", "loss / logit clamps (logits.clamp(min, max)), torchao amax clamp(min=EPS); inplace=1: "
           f"{CLIP_LOGIT}", params={"lo": (-0.5, "none"), "hi": (0.5, "none")}, forms=INPLACE),
    _unary("pow_rsqrt", f"{HF_LLAMA} (torch.rsqrt(variance + eps)) and x.pow(2)", kind="pos",
           params={"exp": (2, 3)}),
    _unary("to_dtype", f"{HF_LLAMA} (hidden_states.to(torch.float32) ... .to(input_dtype)), {TITAN_LOSS} (.float())",
           params={"to": ("float32", "bfloat16")}),
    # optimizer steps: the foreach kernels every trainer's optimizer runs on DTensor parameters
    OpSpec("adamw_foreach", (_a("M N", grad=False), _a("K", grad=False)),
           f"{OPTIM}: _foreach_lerp_, _foreach_mul_, _foreach_addcmul_, _foreach_sqrt, _foreach_addcdiv_",
           {"steps": (1, 2), "weight_decay": (0.1, 0.0)}, grad=False),
    OpSpec("sgd_foreach", (_a("M N", grad=False), _a("K", grad=False)),
           f"{OPTIM}: _foreach_add_ (momentum buffers), _foreach_mul_", {"momentum": (0.9, 0.0)}, grad=False),
    # in-place writes trainers make on parameters, gradients and buffers (no autograd history), on
    # every placement (a Partial gradient before its reduction included), into the input itself
    OpSpec("inplace_scalar", (_a("B? M N", grad=False),),
           f"{ZERO_GRAD} (detach_zero_), {GRAD_SCALER} (mul_, fill_), {ACCUM} (div_), {CLIP_LOGIT} (clamp_), "
           f"{SANITIZE} (nan_to_num_), nn.init.constant_ / zeros_ (fill_, zero_), bias corrections (add_, sub_)",
           {"op": ("mul_", "zero_", "fill_", "div_", "add_", "sub_", "clamp_", "nan_to_num_", "detach_zero_"),
            "value": (0.5, 2.0, -1.5)}, inplace=True),
    OpSpec("inplace_tensor", (_a("B? M N", grad=False), _a("B? M N", grad=False)),
           f"{EMA} (lerp_, copy_), {LOAD_STATE} (copy_), {ACCUM} (add_), {ADAM_SINGLE} (lerp_, addcmul_), "
           "masked updates (mul_ by a tensor), sub_ (SGD's p.sub_(lr * g) written out)",
           {"op": ("lerp_", "copy_", "add_", "sub_", "mul_", "addcmul_"), "weight": (0.1, 0.5, 1.0)}, inplace=True),
    # random ops and init: judged by properties (OpSpec.random)
    _unary("dropout_train", HF_DROPOUT, params={"p": (0.5, 0.1)}, random=True),
    OpSpec("init_", (_a("M N", grad=False),), f"{TITAN_INIT}; {HF_INIT}",
           {"init": ("trunc_normal_", "normal_", "uniform_", "kaiming_uniform_", "xavier_uniform_")},
           grad=False, random=True),
    _unary("rand_like", NOISE, params={"kind": ("randn_like", "rand_like", "bernoulli_")}, grad=False, random=True),
    # losses as TP trainers call them: under loss_parallel() on vocab-sharded logits (OpSpec.context)
    OpSpec("lp_cross_entropy", (_a("M V"), _a("M", "target:V", grad=False), _a("V", "pos", grad=False)),
           f"{TITAN_LP}, {HF_TRAINER} (mean), class weights (weight=1: F.cross_entropy(..., weight=w))",
           {"reduction": ("sum", "mean", "none"), "weight": (0, 1), "label_smoothing": (0.0, 0.1)},
           mins=LP_MINS, context="loss_parallel"),
    OpSpec("lp_nll_log_softmax", (_a("M V"), _a("M", "target:V", grad=False)),
           "torchtune/modules/loss (F.nll_loss(F.log_softmax(x, -1), y, ignore_index=-100)) on TP logits",
           {"reduction": ("sum", "mean")}, mins=LP_MINS, context="loss_parallel"),
    OpSpec("lp_chunked_ce", (_a("B S V"), _a("B S", "target:V", grad=False)), TUNE_CHUNKED,
           {"chunks": (2, 1, 3)}, mins=LP_MINS, context="loss_parallel"),
    OpSpec("lp_z_loss", (_a("M V"), _a("M", "target:V", grad=False)),
           f"{ZLOSS}, added to the token-summed cross entropy", {"coef": (1e-4, 1.0)}, mins=LP_MINS,
           context="loss_parallel"),
    OpSpec("lp_soft_ce", (_a("M V"), _a("M V", grad=False)), TIMM_SOFT, {"how": ("probs", "manual")},
           mins=LP_MINS, context="loss_parallel"),
    OpSpec("lp_kl_div", (_a("M V"), _a("M V", grad=False)), HF_KD, {"temperature": (2.0, 1.0)}, mins=LP_MINS,
           context="loss_parallel"),
    OpSpec("lp_logprobs", (_a("B S V"), _a("B S", "index:V", grad=False), _a("B S", "mask", grad=False)),
           TRL_LOGPS, {"how": ("gather", "selective")}, mins=LP_MINS, context="loss_parallel"),
    OpSpec("value_loss", (_a("B S"), _a("B S", grad=False), _a("B S", grad=False), _a("B S", "mask", grad=False)),
           TRL_VALUE, {"loss": ("clipped_mse", "huber", "mse"), "clip": (0.2, 10.0)}, dtypes=("f32",)),
)

ROUND_2: tuple[OpSpec, ...] = (
    # what models, losses and training loops call outside the transformer step of round 1
    # (docs/fuzz.md "The second round"); every float input takes every placement
    # contrastive heads and similarity losses
    _unary("normalize", OPEN_CLIP, params={"dim": "dim:0"}),
    OpSpec("clip_loss", (_a("M D"), _a("M D"), _a("M", "perm:M", grad=False)), OPEN_CLIP,
           {"scale": (14.3, 1.0)}),
    OpSpec("cosine_similarity", (_a("B? M N"), _a("M N")), COSINE, {"dim": ("-1", "0")}),
    # statistics: BatchNorm-free norms, weight standardization, GroupNorm-style stats
    _unary("var", TIMM_STATS, params={"how": ("var_mean", "var", "std"), "correction": (0, 1), "dim": "dim?:0",
                                      "keepdim": (1, 0)}, forms=USE),
    OpSpec("group_norm", (_a("B G*C H W?"), _a("G*C"), _a("G*C")), DIFFUSERS_RESNET, {"groups": "var:G"},
           mins={"G": 1}),
    _unary("logsumexp", ROUTER_Z, params={"dim": "dim:0", "keepdim": (0, 1), "then": ("none", "z_loss")}),
    # padding, convolution over a sequence, strided slices, shifts
    _unary("pad", f"{HF_MAMBA}; {SWIN}", params={"pad": ("1:0", "0:2", "2:1", "0:0:1:1"), "value": (0.0, -1.0)}),
    OpSpec("causal_conv1d", (_a("B C L"), _a("C 1 K"), _a("C")), HF_MAMBA, mins={"C": 1, "K": 1}),
    _unary("slice", f"{SWIN} (x[..., 0::2, :]), {HF_MAMBA} ([..., :seq_len]), narrow",
           params={"dim": "dim:0", "start": (0, 1), "stop": ("none", -1, 3), "step": (2, 1, 3)}),
    _unary("roll", SWIN, dims="B H W C", params={"shift": (-1, 1, 3), "dims": ("1:2", "1", "-1")}),
    _unary("flip", VIM_FLIP, params={"dim": "dim:0"}),
    # masks built from the sizes of what they mask
    _unary("tril", MASKS, params={"how": ("causal_fill", "tril", "triu"), "diagonal": (0, 1, -1)}),
    OpSpec("position_ids", (_a("B S", "mask", grad=False),), HF_POSITIONS, grad=False),
    # MoE routing: one-hot masks, token counts per expert, sorting, capacity
    OpSpec("one_hot", (_a("B? M", "index:V", grad=False),), HF_ONE_HOT, {"classes": "var:V"}, grad=False,
           mins={"V": 1}),
    OpSpec("count_tokens", (_a("M", "index:V", grad=False),), TITAN_HISTC, {"how": ("histc", "bincount"),
           "bins": "var:V"}, grad=False, mins={"V": 1}),
    _unary("sort", HF_TOP_P, kind="distinct", params={"dim": "dim:0", "descending": (0, 1)}, dtypes=("f32",)),
    _unary("cumprod", DDPM, params={"dim": "dim:0"}),
    # attention variants
    OpSpec("unflatten_heads", (_a("B S H*D"),), DIFFUSERS_HEADS, {"heads": "var:H",
           "then": ("none", "transpose12", "flatten23")}),
    OpSpec("baddbmm", (_a("B M N"), _a("B M K"), _a("B K N")), HF_BLOOM, {"beta": (1.0, 0.5), "alpha": (0.125, 1.0)}),
    OpSpec("outer", (_a("S"), _a("D")), TITAN_FREQS),
    _unary("repeat_interleave", GQA_INTERLEAVE, dims="B H S D", params={"n_rep": (2, 1, 3), "dim": ("-3", "1")}),
    OpSpec("interpolate", (_a("B C H W"),), TIMM_POSEMB, {"mode": ("bicubic_aa", "bicubic", "bilinear", "nearest"),
           "size": (3, 5, 8)}, mins={"H": 1, "W": 1}),
    # float8 scaling and quantization observers, the scaler's found_inf
    _unary("aminmax", AO_OBSERVER, params={"dim": "dim?:0", "keepdim": (0, 1)}, grad=False),
    # no backward: torchao's cast is straight-through (its autograd function returns the gradient as is),
    # so a clamp at the float8 bound is never differentiated (the one the bound's element lands on
    # through Partial shares' rounding, 448.00003, would zero a gradient torchao never computes)
    _unary("fp8_scale", AO_FLOAT8, params={"granularity": ("tensorwise", "rowwise")}, grad=False),
    OpSpec("nonfinite", (_a("B? M N", grad=False), _a("M N", "mask", grad=False)), FOUND_INF,
           {"how": ("isfinite_all", "isinf_any", "amp_unscale"), "poison": (1, 0)}, grad=False),
    # preference and state-space losses
    OpSpec("dpo_loss", (_a("B"), _a("B"), _a("B", grad=False), _a("B", grad=False)), TRL_DPO,
           {"loss": ("sigmoid", "robust", "hinge", "ipo"), "beta": (0.1, 1.0)}, dtypes=("f32",)),
    _unary("softplus", HF_MAMBA, params={"beta": (1.0, 2.0)}),
)

ROUNDS: tuple[tuple[OpSpec, ...], ...] = (ROUND_1, ROUND_2)
"""The inventory's widenings, oldest first. A case draws its op's round from a stream of its own
(distci/fuzz/ops.py `draw_case`), each round with its share of the entries: a widening takes the
indices it draws and leaves every other case of a seed as the earlier rounds drew it."""
INVENTORY: tuple[OpSpec, ...] = tuple(spec for r in ROUNDS for spec in r)

BY_NAME: dict[str, OpSpec] = {spec.name: spec for spec in INVENTORY}


def loss_parallel_layout(spec: OpSpec, axes: int, shapes: tuple[tuple[int, ...], ...], dp: str = "R"
                         ) -> tuple[tuple[str, ...], ...]:
    """The placements a TP run with loss parallel gives a loss's inputs, on a mesh of `axes` axes
    (the tp axis innermost; `dp`, Replicate or Shard(0), on the outer one): the logits (input 0)
    and every input shaped like them sharded on their class (last) dim over tp, the inputs with
    the logits' leading (token) dims placed as loss_parallel() derives them (Replicate over tp,
    the logits' dp placement), anything else (a class weight) Replicate."""
    logits = spec.args[0].dims.split()
    out = []
    for arg, shape in zip(spec.args, shapes):
        dims = arg.dims.split()
        outer = dp if dims[:1] == logits[:1] and shape and shapes[0] and dp != "R" else "R"
        tp = "S-1" if dims == logits else "R"
        out.append((outer, tp) if axes == 2 else (tp,))
    return tuple(out)


def spec_of(name: str) -> OpSpec:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no op {name!r} in the ops inventory; ops: {', '.join(BY_NAME)}") from None


# ------------------------------------------------------------------ the templates' grammar

def variables(spec: OpSpec) -> list[str]:
    """The size variables of an op's templates, in order of first use."""
    out: list[str] = []
    for arg in spec.args:
        for token in arg.dims.split():
            for part in token.rstrip("?").split("*"):
                if not part.isdigit() and part not in out:
                    out.append(part)
        if ":" in arg.kind and arg.kind.split(":", 1)[1] not in out:
            out.append(arg.kind.split(":", 1)[1])
    return out


def optionals(spec: OpSpec) -> list[str]:
    return list(dict.fromkeys(t[:-1] for a in spec.args for t in a.dims.split() if t.endswith("?")))


def shape_of(arg: Arg, sizes: dict[str, int], absent: set[str]) -> tuple[int, ...]:
    out = []
    for token in arg.dims.split():
        if token.endswith("?") and token[:-1] in absent:
            continue
        n = 1
        for part in token.rstrip("?").split("*"):
            n *= int(part) if part.isdigit() else sizes[part]
        out.append(n)
    return tuple(out)


def shapes_of(spec: OpSpec, sizes: dict[str, int], absent: set[str]) -> tuple[tuple[int, ...], ...]:
    return tuple(shape_of(a, sizes, absent) for a in spec.args)
