"""The programs generator's optimizers: each name a program's head may carry
(distci/training_program.py OPTIMIZERS, the `later_optim` round's forms) -> the torch.optim
class and options both twins make, the reference on the full model and the run on the
parallelized one, so a difference between them is the parallel stack's.

A name the stack lacks (a class this torch does not have, a fused kernel this device does not
run) is `missing(name, device_type)`'s reason, and the program skips with it: torch 2.5 has
no Muon, CPU had no fused AdamW before CUDA did.

`muon` is Muon on the 2-D weights and AdamW on everything else, as its users run it
(torchtitan's `DistMuon` beside AdamW in one OptimizersContainer, Keller Jordan's examples):
`Pair` holds the two and faces the loop as one torch.optim.Optimizer (one `state`, one list
of param groups, one state_dict), as torchtitan's container does, so the state-dict
functions and the judge read it like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

WEIGHT_DECAY = 0.1
"""adamw_groups: the decay group's weight decay (the other group's is 0)."""


@dataclass(frozen=True)
class Recipe:
    cls: str
    """The torch.optim class."""
    lr: float
    options: dict = field(default_factory=dict)
    impl: str = ""
    """`fused` / `foreach`: the implementation flag (capabilities.optimizer_impl probes it)."""


RECIPES: dict[str, Recipe] = {
    "sgd": Recipe("SGD", 0.1, {"momentum": 0.9}),
    "sgd0": Recipe("SGD", 0.1),
    "adamw": Recipe("AdamW", 1e-2),
    "adamw_groups": Recipe("AdamW", 1e-2),
    "adamw_fused": Recipe("AdamW", 1e-2, {"fused": True}, "fused"),
    "adamw_foreach": Recipe("AdamW", 1e-2, {"foreach": True}, "foreach"),
    "adam": Recipe("Adam", 1e-2),
    "nadam": Recipe("NAdam", 1e-2),
    "radam": Recipe("RAdam", 1e-2),
    "adafactor": Recipe("Adafactor", 1e-2),
    "adagrad": Recipe("Adagrad", 1e-2),
    "rmsprop": Recipe("RMSprop", 1e-2, {"momentum": 0.9}),
    "muon": Recipe("Muon", 2e-2),
}
"""Learning rates: large enough that every step moves every weight visibly at float32 (a
wrong state shows within a step or two), small enough that the model stays finite."""


def precision(name: str) -> str:
    """The dtype whose tolerance judges a program with optimizer `name` (programs' `compare`).
    Muon orthogonalizes each update in bfloat16 (torch.optim._muon casts the momentum to
    bfloat16 before Newton-Schulz), so a sharded matrix's matmuls, summed in another order,
    round differently: on 2 ranks, a Shard(0) 16x8 update is 30.7 dB from the full one with
    torch's bfloat16 iteration and 109 dB with the same iteration in float32 (torch 2.13.0 and
    2.15.0): bfloat16's rounding, not a wrong gather. Every other optimizer computes in float32."""
    return "bfloat16" if name == "muon" else "float32"


def missing(name: str, device_type: str) -> str | None:
    """Why this stack cannot make optimizer `name` (None: it can)."""
    from ..probes import capabilities

    recipe = RECIPES[name]
    if not hasattr(torch.optim, recipe.cls):
        return f"optim {name}: this torch has no torch.optim.{recipe.cls}"
    if name == "muon" and not hasattr(torch.optim, "AdamW"):
        return "optim muon: this torch has no torch.optim.AdamW for the non-matrix parameters"
    if recipe.impl:
        return capabilities.optimizer_impl(device_type, "adamw", recipe.impl)
    return None


class Pair(torch.optim.Optimizer):
    """Muon on the 2-D weights, AdamW on the rest, as one optimizer: the two share this
    object's `state` and param-group dicts, and each steps its own groups. A param group
    added later (unfreeze=PART_group) goes to AdamW, and a load re-links both."""

    def __init__(self, params: list, lr: float = RECIPES["muon"].lr) -> None:
        if params and isinstance(params[0], dict):  # another Pair's groups (program_relayout's rebuild)
            self.muon = torch.optim.Muon([g for g in params if "ns_steps" in g], lr=lr)
            self.adamw = torch.optim.AdamW([g for g in params if "ns_steps" not in g], lr=lr / 10)
        else:
            matrices = [q for q in params if q.ndim == 2]
            others = [q for q in params if q.ndim != 2]
            if not matrices or not others:
                raise ValueError("optim muon needs 2-D weights and other parameters: "
                                 f"{len(matrices)} matrices, {len(others)} others")
            self.muon = torch.optim.Muon(matrices, lr=lr)
            self.adamw = torch.optim.AdamW(others, lr=lr / 10)
        super().__init__(self.muon.param_groups + self.adamw.param_groups, {})
        self._link()

    def _link(self) -> None:
        """Both halves read this object's state and its group dicts (Muon's: those holding
        its `ns_steps`)."""
        n = sum(1 for g in self.param_groups if "ns_steps" in g)
        self.muon.state, self.muon.param_groups = self.state, self.param_groups[:n]
        self.adamw.state, self.adamw.param_groups = self.state, self.param_groups[n:]

    def add_param_group(self, param_group: dict) -> None:
        self.adamw.add_param_group(param_group)
        self.param_groups.append(self.adamw.param_groups[-1])
        self._link()

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        self.muon.step()
        self.adamw.step()
        return None


def make(name: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """Optimizer `name` over `params` (the trainable parameters, the optimizer's order)."""
    recipe = RECIPES[name]
    if name == "muon":
        return Pair(params, recipe.lr)
    groups: Any = params
    if name == "adamw_groups":  # matrices decay; biases and norms don't (nanoGPT, HF Trainer)
        groups = [{"params": [q for q in params if q.ndim >= 2], "weight_decay": WEIGHT_DECAY},
                  {"params": [q for q in params if q.ndim < 2], "weight_decay": 0.0}]
    return getattr(torch.optim, recipe.cls)(groups, lr=recipe.lr, **recipe.options)
