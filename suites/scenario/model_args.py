"""The model's dimensions, importable without torch (the scenario table and the coverage
renderer read them on machines that have no torch)."""

from __future__ import annotations

from dataclasses import dataclass, replace


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

    def uneven(self, hidden: bool = True) -> "ModelArgs":
        """The same model with dims no mesh divides (the `shard=uneven` rows): a vocabulary
        of one more token (257: prime) and, with `hidden`, a hidden width one less (255;
        experts' 63), so FSDP2's dim-0 shards are padded and TP's vocab (and hidden) Shard
        placements split unevenly (torch.chunk sizes: 129/128 on 2 ranks, 65/65/65/62 on 4).
        TP rows keep the hidden width even (`hidden=False`): a row-parallel layer cannot
        take an uneven local input (pytorch#150336,
        suites/regressions/test_pytorch150336_uneven_rowwise_input.py)."""
        if not hidden:
            return replace(self, vocab_size=self.vocab_size + 1)
        return replace(self, vocab_size=self.vocab_size + 1, ffn_hidden=self.ffn_hidden - 1,
                       expert_hidden=self.expert_hidden - 1 if self.n_experts else self.expert_hidden)

    def check_tp(self, tp: int, uneven: bool = False) -> None:
        """Raises ValueError when a TP degree cannot shard this model. Heads, hidden widths
        and the sequence (sequence parallel) must divide, as torchtitan asserts for heads
        (an uneven hidden width breaks row-parallel layers: pytorch#150336); the vocabulary
        may split unevenly (DTensor's uneven Shard) when `uneven`."""
        for name, value in (
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("ffn_hidden", self.ffn_hidden),
            ("vocab_size", self.vocab_size),
            ("max_seq_len", self.max_seq_len),
            *((("expert_hidden", self.expert_hidden),) if self.n_experts else ()),
        ):
            if value % tp and not (uneven and name == "vocab_size"):
                raise ValueError(f"ModelArgs.{name}={value} is not divisible by TP degree {tp}")
