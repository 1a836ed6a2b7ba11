"""What `CostModel.predict(kind, ...)` reads for each operator kind and each framework term: one
reader per kind in READERS, taking the operator's parameters as its profile records them
(simulator/cost/profile_format.py) and returning a Prediction with its provenance. Operators with
a source (simulator/cost/operators.py) are read through it; the framework terms from the cost
model's fitted numbers. A new operator kind is a builder there and a reader here. No torch."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.policy.dtypes import canonical_dtype
from simulator.cost import operators
from simulator.cost.host import framework_overhead, shape_change_features
from simulator.cost.types import CostReader, Prediction


def gemm(cm: CostReader, m: int, n: int, k: int, dtype: str, name: str | None = None,
         weight_dtype: str | None = None) -> Prediction:
    """name: the layer ('qkv_proj', 'lm_head', ...) when known, to use its own curve.
    weight_dtype: weights stored narrower than the compute dtype (weight-only quantization)."""
    return cm.source("gemm", (n, k, canonical_dtype(dtype), name, weight_dtype)).predict(m)


def attention_prefill(cm: CostReader, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                      dtype: str) -> Prediction:
    shape = (q_len, num_heads, num_kv_heads, head_dim, canonical_dtype(dtype))
    return cm.source("attention_prefill", shape).predict(kv_len)


def attention_decode(cm: CostReader, batch: int, kv_len: int | Sequence[int], num_heads: int, num_kv_heads: int,
                     head_dim: int, dtype: str) -> Prediction:
    """Decode attention of `batch` requests: the work depends on no more than their total context,
    and a profile (equal lengths) is read at the batch's mean length."""
    kv_lens = [kv_len] * batch if isinstance(kv_len, int) else list(kv_len)
    if len(kv_lens) != batch:
        raise ValueError(f"attention_decode: {len(kv_lens)} context lengths for a batch of {batch}")
    shape = (batch, num_heads, num_kv_heads, head_dim, canonical_dtype(dtype))
    return cm.source("attention_decode", shape).predict(sum(kv_lens))


def attention_verify(cm: CostReader, batch: int, q_len: int, kv_len: int, num_heads: int, num_kv_heads: int,
                     head_dim: int, dtype: str) -> Prediction:
    """`batch` verification chunks of q_len queries, each ending at context kv_len: measured
    (attention_verify) where profiled, otherwise read like a batch of decodes over the same keys."""
    source = operators.verify_source(cm, q_len, num_heads, num_kv_heads, head_dim, canonical_dtype(dtype))
    return source.predict((batch, batch * kv_len))


def elementwise(cm: CostReader, name: str, tokens: int, width: int, dtype: str) -> Prediction:
    return cm.source("elementwise", (name, width, canonical_dtype(dtype))).predict(tokens)


def kv_write(cm: CostReader, tokens: int, num_kv_heads: int, head_dim: int, dtype: str) -> Prediction:
    return cm.source("kv_write", (num_kv_heads, head_dim, canonical_dtype(dtype))).predict(tokens)


def sample(cm: CostReader, batch: int, vocab: int, dtype: str = "bf16") -> Prediction:
    """Sampling over float32 logits; dtype picks the compute peak (the op is bandwidth-bound)."""
    return cm.source("sample", (vocab, canonical_dtype(dtype))).predict(batch)


def collective(kind: str) -> Callable[..., Prediction]:
    """all_reduce, all_to_all (each rank sends nbytes, an even share to each) or kv_ring (a CP ring
    hop: nbytes to the next rank), of nbytes over `world` ranks."""
    def read(cm: CostReader, nbytes: int, world: int) -> Prediction:
        return cm.source(kind, (world,)).predict(nbytes)
    return read


def moe_experts(cm: CostReader, rows_per_expert: float, active: float, hidden: int, ffn: int, dtype: str,
                weight_dtype: str | None = None) -> Prediction:
    return operators.moe_experts_prediction(cm, rows_per_expert, active, hidden, ffn, canonical_dtype(dtype),
                                            weight_dtype)


def moe_dispatch(cm: CostReader, tokens: int, num_experts: int, top_k: int, hidden: int, dtype: str) -> Prediction:
    return cm.source("moe_dispatch", (num_experts, top_k, hidden, canonical_dtype(dtype))).predict(tokens)


def step_overhead(cm: CostReader, batch: int) -> Prediction:
    # Without a profile the host-side cost is unknown; it is hidden behind GPU work in a
    # well-pipelined engine, so it counts as zero there.
    return cm.source("step_overhead", ()).predict(batch)


def idle_wakeup(cm: CostReader, idle_s: float) -> Prediction:
    """Extra time of the first step after idle_s seconds without work: interpolated from the
    profile's measurements (none below the shortest idle measured); zero without them."""
    series = cm.series(("idle_wakeup",))
    idle_ms = idle_s * 1e3
    if series is None or idle_ms < series.sizes[0]:
        return Prediction(0.0, "extrapolated" if series is None else "interpolated", 0.0)
    t, provenance = series.at(max(1, round(idle_ms)))
    return Prediction(t if idle_ms < series.sizes[-1] else series.times[-1], provenance, cm.errors[provenance])


def framework(cm: CostReader, num_chunks: int, tokens: int, layers: int, operators_s: float = 0.0,
              prefill_chunks: int = 0, decode_groups: int = 0, verifying: int = 0,
              moe: tuple[float, float] = (0.0, 0.0)) -> Prediction:
    """What a whole step costs beyond the sum of its operators (operators_s): input preparation,
    Python and framework dispatch per layer and per step, and the operators' in-situ speed
    relative to their isolated timings (operator_scale). Zero without whole-forward measurements."""
    f = cm.framework
    if not f:
        return Prediction(0.0, "extrapolated", 0.0)
    t = (f["operator_scale"] - 1.0) * operators_s + framework_overhead(
        f, num_chunks, prefill_chunks, decode_groups, tokens, layers, verifying, moe)
    return Prediction(t, "fitted", cm.errors.get("fitted", 0.15))


def shape_change(cm: CostReader, previous_tokens: int | None, tokens: int) -> Prediction:
    """Extra time of a step of `tokens` tokens right after one of previous_tokens
    (host.SHAPE_CHANGE_TERMS); zero where they were not fitted, or without a previous step."""
    f = cm.framework
    if "step_per_halving_s" not in f:
        return Prediction(0.0, "extrapolated", 0.0)
    halvings, doublings = shape_change_features(previous_tokens, tokens)
    return Prediction(halvings * f["step_per_halving_s"] + doublings * f["step_per_doubling_s"],
                      "fitted", cm.errors.get("fitted", 0.15))


READERS: dict[str, Callable[..., Prediction]] = {
    "gemm": gemm, "attention_prefill": attention_prefill, "attention_decode": attention_decode,
    "attention_verify": attention_verify, "elementwise": elementwise, "kv_write": kv_write, "sample": sample,
    "all_reduce": collective("all_reduce"), "all_to_all": collective("all_to_all"), "kv_ring": collective("kv_ring"),
    "moe_experts": moe_experts, "moe_dispatch": moe_dispatch, "step_overhead": step_overhead,
    "idle_wakeup": idle_wakeup, "framework": framework, "shape_change": shape_change,
}
