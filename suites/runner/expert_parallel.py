"""Expert parallel: the all-to-all dispatch (ExpertParallel), and the two layouts that use
it: `ep` (experts split over every rank, dense weights replicated) and `ep_fsdp`
(torchtitan 0.3's: experts on an ep mesh, FSDP2 over the ranks that own the same experts).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from .fsdp import fsdp_api, mp_policy, reshard_after_forward
from .models import MoE, Transformer


class ExpertParallel:
    """Expert-parallel dispatch for a MoE block: each rank owns n_experts / ws experts.

    Tokens are sorted by the expert they were routed to, sent to the experts' owners with
    one all-to-all (uneven splits: the counts are exchanged first), run through the local
    experts and sent back with a second all-to-all, as torchtitan's expert parallel does.
    Uses the differentiable functional all_to_all_single; torch builds without it
    cannot run EP rows. Dense weights stay replicated (data parallel, gradients
    averaged by the runner); experts' gradients come from every rank's tokens.
    """

    def __init__(self, group: Any, rank: int, size: int, n_experts: int) -> None:
        if n_experts % size:
            raise ValueError(f"{n_experts} experts cannot be split over {size} ranks")
        self.group, self.rank, self.size = group, rank, size
        self.local = n_experts // size
        self.n_experts = n_experts

    def owns(self, expert: int) -> bool:
        return expert // self.local == self.rank

    def __call__(self, moe: MoE, tokens: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        flat = chosen.flatten()
        order = flat.argsort(stable=True)
        token_idx = order // chosen.shape[1]
        gate = weights.flatten()[order].unsqueeze(-1)
        counts = torch.bincount(flat, minlength=self.n_experts)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)  # [src][local expert]
        send_split = counts.view(self.size, self.local).sum(1).tolist()
        recv_matrix = recv_counts.view(self.size, self.local)
        recv_split = recv_matrix.sum(1).tolist()
        received = all_to_all_single_autograd(tokens[token_idx], recv_split, send_split, self.group)
        chunks = list(received.split(recv_matrix.flatten().tolist()))
        outs = [None] * len(chunks)
        for e in range(self.local):
            expert = moe.experts[self.rank * self.local + e]
            mine = [src * self.local + e for src in range(self.size)]
            y = expert(torch.cat([chunks[i] for i in mine]))
            for i, part in zip(mine, y.split([chunks[i].shape[0] for i in mine])):
                outs[i] = part
        returned = all_to_all_single_autograd(torch.cat(outs), send_split, recv_split, self.group)
        return torch.zeros_like(tokens).index_add(0, token_idx, returned * gate)


def apply_ep(model: Transformer, group: Any) -> ExpertParallel:
    """Switches every MoE block to expert-parallel dispatch over `group`."""
    import torch.distributed as dist

    ep = ExpertParallel(group, dist.get_rank(group), dist.get_world_size(group), model.args.n_experts)
    for block in model.layers.values():
        block.feed_forward.dispatch = ep
    return ep


def apply_ep_fsdp(model: Transformer, ep_mesh: Any, efsdp_mesh: Any, dp_mesh: Any, mp: str,
                  reduce_dtype: torch.dtype | None = None, divide: bool = True) -> ExpertParallel:
    """Expert parallel laid out as torchtitan 0.3's `parallelize` for MoE models does.

    Experts are split over `ep_mesh` (each rank keeps only the experts it owns; the
    others are removed from its model, as torchtitan's Shard(0) expert weights hold the
    local experts only) and FSDP2-sharded over `efsdp_mesh`, the ranks that own the same
    experts; every block (attention, norms, router) and the root are FSDP2-sharded over
    `dp_mesh`, every rank. Gradients therefore live on two meshes. An expert's gradient
    sums the tokens of its whole ep group, so its reduction divides by the data-parallel
    size, not the efsdp size (torchtitan's `set_gradient_divide_factor`; `divide=False` is
    the mutation that leaves FSDP2's default).
    """
    fully_shard, _ = fsdp_api()
    policy = mp_policy(mp, reduce_dtype)
    ep = ExpertParallel(ep_mesh.get_group(), ep_mesh.get_local_rank(), ep_mesh.size(), model.args.n_experts)
    blocks = list(model.layers.values())
    for block in blocks:
        moe = block.feed_forward
        moe.dispatch = ep
        for e in range(ep.n_experts):
            if not ep.owns(e):
                moe.experts[e] = nn.Module()  # not this rank's: no parameters here
        for e in range(ep.n_experts):
            if ep.owns(e):
                expert = moe.experts[e]
                fully_shard(expert, mesh=efsdp_mesh, mp_policy=policy, reshard_after_forward=False)
                if divide:
                    setter = getattr(expert, "set_gradient_divide_factor", None) or \
                        expert.set_reduce_scatter_divide_factor
                    setter(float(dp_mesh.size()))
    for block, again in zip(blocks, reshard_after_forward(len(blocks))):
        fully_shard(block, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=again)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy, reshard_after_forward=False)
    return ep
