"""What context parallelism adds to a step (ContextParallel: the step assembler's strategy for a
replica of cp ranks, as engine/context_parallel.py and engine/ring_attention.py run it; each rank
a TP group). No torch.

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
communication in the time split.
"""

from __future__ import annotations

from engine.policy.dtypes import DTYPE_BYTES
from simulator.cost.shape import ReplicaShape
from simulator.cost.types import CostReader, Prediction, StepCost

LSE_BYTES = 4  # float32 log-sum-exps and partial outputs (engine/ring_attention.py partial_attention)


def per_rank(count: int, cp: int) -> int:
    """A rank's share of `count` tokens (queries, keys) spread evenly: the busiest rank's."""
    return -(-count // cp)


class ContextParallel:
    def __init__(self, cost_model: CostReader, shape: ReplicaShape) -> None:
        if shape.cp < 2:
            raise ValueError(f"ContextParallel needs cp >= 2, got {shape.cp}")
        self.cost_model, self.cp, self.layers = cost_model, shape.cp, shape.model.num_layers
        recipe = shape.recipe
        heads, head_dim, width = recipe.heads, shape.model.head_dim, DTYPE_BYTES[recipe.dtype]
        self._query_bytes = heads * head_dim * width  # one query row, per layer
        self._combine_bytes = heads * (head_dim + 1) * LSE_BYTES  # its partial output and log-sum-exps
        self._row_bytes = shape.model.hidden_size * width  # a hidden state
        self._kv_bytes_per_layer = recipe.kv_bytes_per_token(shape.kv_dtype) / self.layers  # a token's K and V
        self._ring: dict[int, float] = {}
        self._collectives: dict[tuple[int, int], float] = {}

    def share(self, count: int) -> int:
        return per_rank(count, self.cp)

    def ring_s(self, keys: int) -> float:
        """Seconds, all layers, of the ring passing `keys` keys per rank: cp - 1 hops a layer."""
        value = self._ring.get(keys)
        if value is None:
            hop = self.cost_model.predict("kv_ring", keys * self._kv_bytes_per_layer, self.cp).time_s
            value = self._ring[keys] = (self.cp - 1) * hop * self.layers
        return value

    def collectives_s(self, queries: int, rows: int) -> float:
        """Seconds of the decode queries' gather and combination (every layer) and of the LM head
        rows' sum onto rank 0 (once)."""
        key = (queries, rows)
        value = self._collectives.get(key)
        if value is None:
            def reduce(nbytes: float) -> float:
                return self.cost_model.predict("all_reduce", nbytes, self.cp).time_s
            per_layer = (reduce(queries * self._query_bytes) + reduce(queries * self._combine_bytes)) if queries \
                else 0.0
            value = self._collectives[key] = per_layer * self.layers + (reduce(rows * self._row_bytes) if rows else 0.0)
        return value

    def extra_s(self, queries: int, rows: int, ring_keys: int, prefill_s: float,
                ledger: StepCost | None = None) -> float:
        """The communication context parallelism adds to a step: the gathered queries' collectives
        (`queries`: the decode and verification queries), the LM head rows' sum, and the ring's wait
        beyond the prefill attention it overlaps (prefill_s: a rank's)."""
        extra = self.collectives_s(queries, rows)
        if ring_keys:
            extra += max(0.0, self.ring_s(ring_keys) - prefill_s)
        if ledger is not None:
            ledger.add("context_parallel", Prediction(extra, "extrapolated", self.cost_model.unvalidated_error))
        return extra
