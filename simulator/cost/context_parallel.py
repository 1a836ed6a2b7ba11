"""Step times of a context-parallel replica: StepTimer's parts as engine/context_parallel.py and
engine/ring_attention.py run them on cp ranks (each a TP group). No torch.

Every sequence's KV is split over the ranks by position (a rank holds block_size tokens of each
virtual block), and each rank computes the step's tokens whose KV it holds. So, the busiest rank
setting the step and the tokens taken as spread evenly:

* token operators (GEMMs, norms, TP all-reduces, ...) run on ceil(tokens / cp) tokens per rank;
* a prefill chunk of n tokens at context L (after the chunk) is ring attention: a rank's
  ceil(n / cp) queries attend over all L keys while every rank's K/V shards of the step's prefill
  sequences go round the ring in one buffer, cp - 1 hops per layer, each hop every rank sending
  its shards (ceil(L / cp) tokens of each prefill sequence) to the next (CostModel's kv_ring).
  The engine overlaps each hop with attention over the shard at hand, so per layer the step
  waits for max(attention, ring): the ring's excess over attention is exposed communication;
* decode and verification queries are gathered on every rank and attended over each rank's shard
  (context / cp), the partial outputs combined by log-sum-exp: per layer an all-reduce of the
  queries (compute dtype), an all-gather of the log-sum-exps and an all-reduce of the float32
  outputs (an all-gather costed as an all-reduce of its bytes);
* once per step the hidden states of the rows the LM head needs are summed over the ranks (each
  row is one rank's) for rank 0's LM head, which runs on all of them.

Weights are replicated on every rank, so a step reads them cp times (MBU); its FLOPs are the
replica's, spread over cp times the GPUs. The exposed ring and the collectives count as
communication in the time split. cp=1 is StepTimer itself (make_step_timer).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.policy.dtypes import DTYPE_BYTES
from simulator.cost.steady_runs import StepParts
from simulator.cost.step_timer import StepTimer

LSE_BYTES = 4  # float32 log-sum-exps and partial outputs (engine/ring_attention.py partial_attention)


def make_step_timer(cp: int = 1, **fields) -> StepTimer:
    """A StepTimer, context-parallel over cp ranks where cp > 1 (fields: StepTimer's)."""
    return StepTimer(**fields) if cp == 1 else ContextParallelTimer(**fields, cp=cp)


def per_rank(count: int, cp: int) -> int:
    """A rank's share of `count` tokens (queries, keys) spread evenly: the busiest rank's."""
    return -(-count // cp)


@dataclass
class ContextParallelTimer(StepTimer):
    cp: int = 2

    def __post_init__(self) -> None:
        if self.cp < 2:
            raise ValueError(f"ContextParallelTimer needs cp >= 2, got {self.cp}: use StepTimer")
        if self.pp != 1:
            raise ValueError("context parallelism is simulated without pipeline parallelism: use pp=1")
        super().__post_init__()
        heads, head_dim = self.recipe.heads, self.model.head_dim
        self._query_bytes = heads * head_dim * DTYPE_BYTES[self.recipe.dtype]  # one query row, per layer
        self._combine_bytes = heads * (head_dim + 1) * LSE_BYTES  # its partial output and log-sum-exps
        self._row_bytes = self.model.hidden_size * DTYPE_BYTES[self.recipe.dtype]  # a hidden state
        self._kv_bytes_per_layer = self._kv_bytes_per_token / self._layers  # a token's K and V, one layer
        self._ring_keys = 0  # the step's prefill keys that travel the ring: one rank's shard of each
        self._ring: dict[int, float] = {}
        self._rank_prefill: dict[tuple[int, int], float] = {}
        self._collectives: dict[tuple[int, int], float] = {}

    # -- a rank's share of the parts ----------------------------------------------------------
    def token_ops(self, tokens: int) -> tuple[float, float]:
        return super().token_ops(per_rank(tokens, self.cp))

    def weight_bytes(self, tokens: int) -> float:
        """Every rank reads its copy of the weights for its share of the tokens."""
        return self.cp * super().weight_bytes(per_rank(tokens, self.cp))

    def prefill_attention(self, num_tokens: int, context_len: int) -> float:
        """A rank's queries of the chunk over the whole context (the ring's wait is _complete's)."""
        return self._memo(self._rank_prefill, (num_tokens, context_len),
                          lambda: super(ContextParallelTimer, self).prefill_attention(per_rank(num_tokens, self.cp),
                                                                                      context_len))

    def decode_attention(self, batch: int, total_context: int) -> float:
        return super().decode_attention(batch, per_rank(total_context, self.cp))

    def verify_attention(self, batch: int, queries: int, total_context: int) -> float:
        return super().verify_attention(batch, queries, per_rank(total_context, self.cp))

    def padded_decode_attention(self, context_lens: list[int]) -> tuple[float, int]:
        return super().padded_decode_attention([per_rank(c, self.cp) for c in context_lens])

    # -- what context parallelism adds -------------------------------------------------------
    def ring_s(self, keys: int) -> float:
        """Seconds, all layers, of the ring passing `keys` keys per rank: cp - 1 hops a layer."""
        def compute() -> float:
            hop = self.cost_model.predict_collective("kv_ring", keys * self._kv_bytes_per_layer, self.cp).time_s
            return (self.cp - 1) * hop * self._layers
        return self._memo(self._ring, keys, compute)

    def collectives_s(self, queries: int, rows: int) -> float:
        """Seconds of the decode queries' gather and combination (every layer) and of the LM head
        rows' sum onto rank 0 (once)."""
        def compute() -> float:
            reduce = self.cost_model.predict_all_reduce
            per_layer = (reduce(queries * self._query_bytes, self.cp).time_s
                         + reduce(queries * self._combine_bytes, self.cp).time_s) if queries else 0.0
            return per_layer * self._layers + (reduce(rows * self._row_bytes, self.cp).time_s if rows else 0.0)
        return self._memo(self._collectives, (queries, rows), compute)

    def _parts(self, chunks) -> StepParts | None:
        # Prefill chunks as StepTimer._parts counts them (more than one token, is_prefill): each
        # sends its sequence's shard of keys round the ring, all in one buffer (_complete reads it).
        self._ring_keys = sum(per_rank(start + n, self.cp) for _, start, n, is_prefill, _ in chunks
                              if is_prefill and n > 1)
        return super()._parts(chunks)

    def _complete(self, tokens: int, sampled: int, decodes: int, decode_context: int, prefill_tokens: int,
                  prefill_s: float, keys: int, prefill_context: int, num_chunks: int, decode_s: float,
                  groups: int, verifying: int = 0) -> StepParts:
        """StepTimer's parts with the collectives above and the ring's wait beyond attention
        (tokens - prefill_tokens: the decode and verification queries gathered)."""
        ring_keys, self._ring_keys = self._ring_keys, 0  # read once: a steady decode run has none
        parts = super()._complete(tokens, sampled, decodes, decode_context, prefill_tokens, prefill_s, keys,
                                  prefill_context, num_chunks, decode_s, groups, verifying)
        extra = self.collectives_s(tokens - prefill_tokens, sampled)
        if ring_keys:
            extra += max(0.0, self.ring_s(ring_keys) - prefill_s)
        return parts._replace(comm_s=parts.comm_s + extra * self._operator_scale)
