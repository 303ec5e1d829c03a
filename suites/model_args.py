"""The model's dimensions, importable without torch (the scenario table and the coverage
renderer read them on machines that have no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelArgs:
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 8
    n_kv_heads: int = 4
    ffn_hidden: int = 256
    vocab_size: int = 256
    max_seq_len: int = 32
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    lora_rank: int = 0
    """> 0: LoRA-style adapters (rank r) beside wq, wv and feed_forward.w1 (the `lora` rows)."""
    n_experts: int = 0
    """> 0: every block's feed-forward is a mixture of experts (router, top-k, experts)."""
    top_k: int = 2
    expert_hidden: int = 64
    tie: bool = False
    """The output projection shares the token embedding's weight (one parameter, two modules)."""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def check_tp(self, tp: int) -> None:
        """Raises ValueError when a TP degree cannot shard this model evenly."""
        for name, value in (
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("ffn_hidden", self.ffn_hidden),
            ("vocab_size", self.vocab_size),
            ("max_seq_len", self.max_seq_len),
            *((("expert_hidden", self.expert_hidden),) if self.n_experts else ()),
        ):
            if value % tp:
                raise ValueError(f"ModelArgs.{name}={value} is not divisible by TP degree {tp}")
