"""Where trainers call each op of the ops inventory (distci/op_inventory.py): the files read.

One owner for the `where` of every OpSpec: a name per trainer file (or family of files), with the
call it makes in parentheses, so an entry reads `f"{TITAN_MOE} (torch.histc(...))"` and a reader can
open the file and find the call. Strings only: the records layer, imported by the inventory alone.
"""

from __future__ import annotations

TITAN_LLAMA = "torchtitan/models/llama3/model/model.py"
TITAN_MOE = "torchtitan/models/moe/moe.py"
TITAN_LOSS = "torchtitan/components/loss.py"
TITAN_CLIP = "torchtitan/distributed/utils.py (clip_grad_norm_)"
TUNE_CE = "torchtune/modules/loss/ce_chunked_output_loss.py"
TUNE_DPO = "torchtune/rlhf/loss/dpo.py + torchtune/rlhf/_generation.py (logits_to_logprobs)"
HF_LLAMA = "transformers/models/llama/modeling_llama.py"
HF_GPT2 = "transformers/pytorch_utils.py (Conv1D) + models/gpt2/modeling_gpt2.py"
HF_TRAINER = "transformers/trainer_pt_utils.py (LabelSmoother) + trainer.py"
OPTIM = "torch/optim/adamw.py, sgd.py (_multi_tensor_*: the foreach path every trainer's optimizer takes)"
HF_VIT = "transformers/models/vit/modeling_vit.py (ViTPatchEmbeddings: nn.Conv2d(kernel_size=patch, stride=patch))"
HF_MIXTRAL = "transformers/models/mixtral/modeling_mixtral.py (loss += router_aux_loss_coef * aux_loss)"
HF_MIXTRAL_AUX = "transformers/models/mixtral/modeling_mixtral.py (load_balancing_loss_func)"
HF_MIXTRAL_MOE = "transformers/models/mixtral/modeling_mixtral.py (MixtralSparseMoeBlock: index_add_)"
HF_GEMMA2 = "transformers/models/gemma2/modeling_gemma2.py (final_logit_softcapping, attn_logit_softcapping)"
TUNE_KD = "torchtune/modules/loss/kd_losses.py (ForwardKLLoss: knowledge distillation recipes)"
TITAN_FLUX = "torchtitan/experiments/flux (the denoising loss: F.mse_loss of the predicted noise)"
TIMM_VIT = "timm/models/vision_transformer.py (Attention: q, k, v = qkv.reshape(...).permute(...).unbind(0))"
TITAN_EP = ("torchtitan/distributed/expert_parallel.py + models/moe (_unpermute: out_unpermuted = "
            "out.new_empty(input_shape); out_unpermuted[permuted_indices, :] = out)")
MASK_TOKENS = "masked-prediction models (MAE / BEiT / data2vec: x[mask_rows] = mask_token, an activation written in place)"
HF_SEQ_CLS = ("transformers/models/*/modeling_*.py ForSequenceClassification (MSELoss for regression, "
              "BCEWithLogitsLoss for multi-label)")
ZERO_GRAD = ("torch/optim/optimizer.py (zero_grad(set_to_none=False): p.grad.detach_() or requires_grad_(False), "
             "then p.grad.zero_())")
GRAD_SCALER = "torch/amp/grad_scaler.py (unscale_: grads *= inv_scale; update(): scale.fill_ / mul_)"
ACCUM = "transformers/trainer.py (loss = loss / gradient_accumulation_steps), gradient accumulation (acc.add_(g))"
EMA = ("torch/optim/swa_utils.py (get_ema_avg_fn: ema.lerp_(p, 1 - decay)), timm/utils/model_ema.py "
       "(ModelEmaV3: ema_v.lerp_(model_v, 1 - decay); ema_v.copy_(model_v) for buffers)")
LOAD_STATE = "torch/nn/modules/module.py (_load_from_state_dict: param.copy_(input_param))"
ADAM_SINGLE = "torch/optim/adam.py (_single_tensor_adam: exp_avg.lerp_(grad, 1 - beta1), exp_avg_sq.mul_(b2).addcmul_(g, g))"
CLIP_LOGIT = "open_clip/train.py (model.logit_scale.clamp_(0, math.log(100))), WGAN weight clipping (p.clamp_(-c, c))"
SANITIZE = "grad and loss sanitizers (torch.nan_to_num_(g, nan=0.0, posinf=..., neginf=...))"
TITAN_INIT = ("torchtitan/models/llama3/model/model.py (init_weights after model.to_empty(): "
              "nn.init.trunc_normal_(w, mean=0.0, std=init_std) on sharded DTensor parameters)")
HF_INIT = ("transformers/modeling_utils.py (_init_weights: module.weight.data.normal_(0.0, std)), "
           "torch/nn/modules/linear.py (reset_parameters: init.kaiming_uniform_(w, a=sqrt(5))), xavier_uniform_")
HF_DROPOUT = "transformers models in training (nn.Dropout(config.hidden_dropout_prob): F.dropout(x, p, training=True))"
TITAN_LP = ("torchtitan/components/loss.py (cross_entropy_loss: reduction='sum' over pred.flatten(0, 1), "
            "divided by the global token count; its tests take torch.distributed.tensor.parallel.loss_parallel() "
            "as the ground truth) + torchtitan/models/llama3/infra/parallelize.py (ColwiseParallel output: "
            "Shard(-1) logits when loss parallel is on)")
TUNE_CHUNKED = ("torchtune/modules/loss/ce_chunked_output_loss.py (CEWithChunkedOutputLoss: logits in chunks "
                "over the sequence, cross_entropy(reduction='sum') each, divided by (labels != -100).sum())")
TRL_LOGPS = ("trl/trainer/utils.py (selective_log_softmax: gather of logits minus logsumexp), "
             "olmo_core/generate/utils.py (selective_log_softmax: log_softmax, gather, squeeze(-1)), "
             "trl/trainer/dpo_trainer.py + torchtune/rlhf (log_softmax + gather on the vocab dim, masked sums)")
ZLOSS = "PaLM / OLMo / Chameleon z-loss (z_loss = coef * logsumexp(logits, -1) ** 2, masked mean over tokens)"
HF_KD = ("transformers distillation examples, DistillKit (F.kl_div(F.log_softmax(s / T, -1), F.softmax(t / T, -1), "
         "reduction='batchmean') * T ** 2)")
TIMM_SOFT = ("timm/loss/cross_entropy.py (SoftTargetCrossEntropy: sum(-target * log_softmax(x, -1), -1).mean()) "
             "and F.cross_entropy(logits, probs) (mixup / cutmix soft labels)")
TRL_VALUE = ("trl/trainer/ppo_trainer.py (value loss: clamp(vpred, v_old -+ clip), max of the two squared errors, "
             "masked_mean over the response tokens), value heads with F.huber_loss / F.mse_loss")
NOISE = ("diffusers / torchtitan flux training (noise = torch.randn_like(latents)), timm/layers/drop.py "
         "(drop_path: x.new_empty(shape).bernoulli_(keep_prob))")

# ---------------------------------------------------------------- the second round (2026-12-07)
# ops models, losses and training loops call on sharded activations, parameters and gradients
# outside the transformer step the first round came from
OPEN_CLIP = ("open_clip/model.py (encode_image / encode_text: F.normalize(features, dim=-1)) + open_clip/loss.py "
             "(ClipLoss: logit_scale * image_features @ text_features.T, cross entropy both ways, averaged)")
COSINE = ("sentence_transformers/losses/CosineSimilarityLoss.py (torch.cosine_similarity(emb_a, emb_b)), "
          "SimSiam / BYOL heads (F.cosine_similarity(p, z.detach(), dim=-1))")
TIMM_STATS = ("timm/layers/norm.py (LayerNorm2d / _layer_norm_cf: torch.var_mean(x, dim=1, unbiased=False, "
              "keepdim=True)), timm/layers/std_conv.py (weight standardization: torch.std_mean / var over the fan-in)")
DIFFUSERS_RESNET = "diffusers/models/resnet.py (ResnetBlock2D: nn.GroupNorm(num_groups=groups, num_channels=C))"
ROUTER_Z = ("transformers/models/switch_transformers/modeling_switch_transformers.py (router_z_loss_func: "
            "torch.logsumexp(router_logits, dim=-1) ** 2 summed over tokens, divided by their count)")
HF_MAMBA = ("transformers/models/mamba/modeling_mamba.py (slow_forward: self.conv1d(hidden_states)[..., :seq_len] "
            "with nn.Conv1d(groups=C, padding=K-1); conv_state = F.pad(hidden_states, (K - L, 0)); "
            "F.softplus(discrete_time_step))")
SWIN = ("timm/models/swin_transformer.py (SwinTransformerBlock: torch.roll(x, shifts=(-s, -s), dims=(1, 2)); "
        "PatchMerging / torchvision swin _patch_merging_pad: x[..., 0::2, 0::2, :]; F.pad to the window size)")
MASKS = ("transformers/modeling_attn_mask_utils.py + models (torch.triu / tril of a mask the scores' size, "
         "masked_fill(~mask, min)), Mamba2 segsum (masked_fill(~torch.tril(ones, diagonal), -inf))")
HF_ONE_HOT = ("transformers/models/mixtral/modeling_mixtral.py (expert_mask = F.one_hot(selected_experts, "
              "num_classes=num_experts))")
TITAN_HISTC = ("torchtitan/models/moe/moe.py (TokenChoiceTopKRouter: num_tokens_per_expert = torch.histc("
               "selected_experts_indices.view(-1), bins=num_experts, min=0, max=num_experts)), Megatron-LM "
               "moe_utils (torch.bincount(indices, minlength=num_experts))")
HF_TOP_P = ("transformers/generation/logits_process.py (TopPLogitsWarper: torch.sort(scores, descending=False), "
            "softmax(-1).cumsum(-1)), RL rollouts sampling on sharded logits")
DDPM = "diffusers/schedulers/scheduling_ddpm.py (self.alphas_cumprod = torch.cumprod(self.alphas, dim=0))"
VIM_FLIP = ("hustvl/Vim models_mamba.py (VisionMamba bidirectional layers: self.layers[2i + 1]("
            "hidden_states.flip([1]), residual.flip([1])), hidden_states_f + hidden_states_b.flip([1]))")
DIFFUSERS_HEADS = ("diffusers/models/transformers/transformer_flux.py (FluxAttnProcessor: query.unflatten(-1, "
                   "(attn.heads, -1)), ... hidden_states.flatten(2, 3))")
HF_BLOOM = ("transformers/models/bloom/modeling_bloom.py (BloomAttention: alibi.baddbmm(batch1=query_layer, "
            "batch2=key_layer, beta=self.beta, alpha=self.inv_norm_factor))")
TITAN_FREQS = ("torchtitan/models/llama3/model/model.py (precompute_freqs_cis: freqs = torch.outer(t, freqs)), "
               "positions sharded over the sequence by context parallelism")
GQA_INTERLEAVE = ("F.scaled_dot_product_attention(enable_gqa=True) as torchtitan's and HF's sdpa attention "
                  "call it with fewer kv heads (aten/src/ATen/native/transformers/attention.cpp "
                  "pre_process_group_query_attention_input: key.repeat_interleave(q_heads // kv_heads, -3); "
                  "the same in torch/nn/functional.py's documented reference)")
TIMM_POSEMB = ("timm/layers/pos_embed.py (resample_abs_pos_embed: F.interpolate(posemb, size=new_size, "
               "mode='bicubic', antialias=True)), transformers/models/vit/modeling_vit.py (interpolate_pos_encoding)")
AO_OBSERVER = ("torch/ao/quantization/observer.py (MinMaxObserver: torch.aminmax(x); PerChannelMinMaxObserver: "
               "torch.aminmax(y, dim=1)): QAT's observers on sharded weights and activations")
AO_FLOAT8 = ("torchao/float8/float8_utils.py (tensor_to_amax: torch.max(torch.abs(x)), rowwise amax(dim=-1); "
             "amax_to_scale: float8_max / torch.clamp(amax.to(float64), min=EPS)) + float8_scaling_utils.py "
             "(x * scale, clamp to the float8 range; scale.reciprocal() for _scaled_mm)")
FOUND_INF = ("torch/amp/grad_scaler.py (_unscale_grads_: torch._amp_foreach_non_finite_check_and_unscale_), "
             "FSDP2 / DDP found_inf checks (torch.isfinite(g).all(), torch.isinf(norm).any()): sanitizers")
TRL_DPO = ("trl/trainer/dpo_trainer.py (dpo_loss: sigmoid -F.logsigmoid(beta * logits), robust, hinge "
           "relu(1 - beta * logits), ipo (logits - 1 / (2 beta)) ** 2, .mean()), torchtune/rlhf/loss/dpo.py")
HF_POSITIONS = ("transformers models' generation and packed batches (position_ids = attention_mask.long()"
                ".cumsum(-1) - 1; position_ids.masked_fill_(attention_mask == 0, 1))")
