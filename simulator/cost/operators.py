"""How each operator kind finds its source on a cost model: measured where the profile has its
shape, otherwise a roofline x efficiency curve or a formula. One builder per kind (BUILDERS);
a new operator is a builder here and a line in the step recipe. No torch."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from engine.policy.dtypes import DTYPE_BYTES, WEIGHT_BYTES
from simulator.cost.curves import curve_key
from simulator.cost.efficiency import (decode_attention_work_total, elementwise_work, gemm_work, kv_write_work,
                                       prefill_attention_work)
from simulator.cost.moe import step_load
from simulator.cost.series import Series, across_counts
from simulator.cost.sources import Composite, Formula, Measured, Source
from simulator.cost.types import CostReader, Prediction


def gemm(cm: CostReader, n: int, k: int, dtype: str, name: str | None, weight_dtype: str | None) -> Source:
    """weight_dtype narrower than dtype (weight-only quantization): measured with the engine's
    quantized kernels (gemm_quant) where profiled, else the same curve over fewer weight bytes --
    never a profile's point of other weights."""
    if weight_dtype is not None and weight_dtype != dtype:
        series = cm.series(("gemm_quant", n, k, dtype, weight_dtype))
        if series is not None:
            return Measured(series, cm.errors)
        saved = k * n * (DTYPE_BYTES[dtype] - WEIGHT_BYTES[weight_dtype])

        def narrower(m: int) -> tuple[float, float]:
            flops, nbytes = gemm_work(m, n, k, dtype)
            return flops, nbytes - saved
        return cm.modeled(curve_key("gemm", name), dtype, narrower, "extrapolated", cm.unvalidated_error)
    series = cm.series(("gemm", n, k, dtype))
    if series is not None:
        return Measured(series, cm.errors)
    return cm.modeled(curve_key("gemm", name), dtype, lambda m: gemm_work(m, n, k, dtype))


def attention_prefill(cm: CostReader, q_len: int, heads: int, kv_heads: int, head_dim: int, dtype: str) -> Source:
    """Size: the context (kv_len) the chunk's q_len queries attend to."""
    series = cm.series(("attention_prefill", q_len, heads, kv_heads, head_dim, dtype))
    if series is not None:
        return Measured(series, cm.errors)
    return cm.modeled(curve_key("attention_prefill", head_dim=head_dim), dtype,
                      lambda kv: prefill_attention_work(q_len, kv, heads, kv_heads, head_dim, dtype))


def attention_decode(cm: CostReader, batch: int, heads: int, kv_heads: int, head_dim: int, dtype: str) -> Source:
    """Size: the batch's total context; a profile (equal lengths) is read at its mean."""
    series = cm.series(("attention_decode", batch, heads, kv_heads, head_dim, dtype))
    if series is not None:
        return Measured(series, cm.errors, reads=lambda total: max(1, round(total / batch)))
    return cm.modeled(curve_key("attention_decode", head_dim=head_dim), dtype,
                      lambda total: decode_attention_work_total(total, batch, heads, kv_heads, head_dim, dtype))


class AttentionVerify(Source):
    """One speculative-verification attention call (engine/attention.py VerifyBatch: chunks of
    `queries` tokens, padded to the longest); size (chunks, their total context). From the
    profile's attention_verify points: the smallest measured query count that holds `queries`,
    linear in the chunk count between measured counts (proportional past the largest), each count
    read at the chunks' mean context."""

    name = "attention_verify"

    def __init__(self, cm: CostReader, by_batch: dict[int, Series], exact: dict[int, Series]) -> None:
        self.errors, self.by_batch, self.batches, self.exact = cm.errors, by_batch, sorted(by_batch), exact

    def time(self, size) -> float:
        batch, total_kv = size
        kv = max(1, round(total_kv / batch))
        return across_counts(self.batches, batch, lambda b: self.by_batch[b].at(kv), scale_below=False)[0]

    def predict(self, size) -> Prediction:
        batch, total_kv = size
        series = self.exact.get(batch)
        provenance = series.at(max(1, round(total_kv / batch)))[1] if series is not None else "interpolated"
        return Prediction(self.time(size), provenance, self.errors[provenance])


def attention_verify(cm: CostReader, queries: int, heads: int, kv_heads: int, head_dim: int,
                     dtype: str) -> Source | None:
    """None where the profile has no such points (verify_source reads it like decodes)."""
    by_q: dict[int, dict[int, Series]] = defaultdict(dict)
    for key in cm.series_keys():
        if key[0] == "attention_verify" and key[3:] == (heads, kv_heads, head_dim, dtype):
            by_q[key[2]][key[1]] = cm.series(key)
    if not by_q:
        return None
    fitting = [q for q in by_q if q >= queries]
    return AttentionVerify(cm, by_q[min(fitting) if fitting else max(by_q)], by_q.get(queries, {}))


def verify_source(cm: CostReader, queries: int, heads: int, kv_heads: int, head_dim: int, dtype: str) -> Source:
    """Verification attention of chunks of `queries` tokens, sized (chunks, their total context):
    attention_verify where profiled, else decode attention over the same keys."""
    source = cm.source("attention_verify", (queries, heads, kv_heads, head_dim, dtype))
    return source if source is not None else VerifyAsDecodes(cm, heads, kv_heads, head_dim, dtype)


class VerifyAsDecodes(Source):
    """Verification chunks read like one batch of decodes over the same keys (bound by its KV reads)."""

    name = "attention_decode"

    def __init__(self, cm: CostReader, heads: int, kv_heads: int, head_dim: int, dtype: str) -> None:
        self.cm, self.shape = cm, (heads, kv_heads, head_dim, dtype)

    def time(self, size) -> float:
        return self.cm.source("attention_decode", (size[0], *self.shape)).time(size[1])

    def predict(self, size) -> Prediction:
        return self.cm.source("attention_decode", (size[0], *self.shape)).predict(size[1])


def elementwise(cm: CostReader, name: str, width: int, dtype: str) -> Source:
    series = cm.series(("elementwise", name, width, dtype))
    if series is not None:
        return Measured(series, cm.errors)
    return cm.modeled(curve_key("elementwise", name), dtype, lambda t: elementwise_work(t, width, dtype))


def kv_write(cm: CostReader, kv_heads: int, head_dim: int, dtype: str) -> Source:
    series = cm.series(("kv_write", kv_heads, head_dim, dtype))
    if series is not None:
        return Measured(series, cm.errors)
    return cm.modeled("kv_write", dtype, lambda t: kv_write_work(t, kv_heads, head_dim, dtype))


def sample(cm: CostReader, vocab: int, dtype: str) -> Source:
    """Over float32 logits; dtype picks the compute peak (the op is bandwidth-bound)."""
    series = cm.series(("sample", vocab))
    if series is not None:
        return Measured(series, cm.errors)
    return cm.modeled("sample", dtype, lambda batch: elementwise_work(batch, vocab, "fp32"))


def _collective(cm: CostReader, kind: str, world: int, bytes_per_link: Callable[[int], float]) -> Source:
    """Size: bytes. Measured where profiled, otherwise `bytes_per_link` over each link at the fitted
    efficiency plus a fixed and a per-hop latency (cm.collective, read at call time)."""
    if world <= 1:
        return Formula(lambda nbytes: 0.0, "measured", 0.0)
    series = cm.series((kind, world))
    if series is not None:
        return Measured(series, cm.errors)
    link = (cm.accelerator.interconnect_gbps or 64) * 1e9

    def modeled(nbytes: int) -> float:
        c = cm.collective
        return c["base_s"] + c["per_hop_s"] * (world - 1) + bytes_per_link(nbytes) / (c["link_efficiency"] * link)
    return Formula(modeled, "extrapolated", cm.errors.get("by_curve", {}).get("all_reduce", cm.unvalidated_error))


def all_reduce(cm: CostReader, world: int) -> Source:
    """Ring all-reduce: 2 (w-1)/w of the bytes cross each link. Under a serving engine's profile
    (cm.engine): its own algorithms on this device's link (engine_all_reduce)."""
    engine = cm.engine
    if world > 1 and engine is not None and (engine.nccl or engine.custom_all_reduce) \
            and cm.series(("all_reduce", world)) is None:
        return engine_all_reduce(cm, world)
    return _collective(cm, "all_reduce", world, lambda nbytes: 2 * (world - 1) / world * nbytes)


def engine_all_reduce(cm: CostReader, world: int) -> Source:
    """The engine's custom all-reduce where it applies (below its size limit, at a world size it
    supports, every GPU pair on NVLink or only two GPUs): one-shot, each rank reading its w - 1
    peers' buffers, below the one-shot size, else two-shot (2 (w-1)/w of the bytes); NCCL's ring
    otherwise. Bandwidth: one direction of the link (interconnect_gbps counts both)."""
    engine, accelerator = cm.engine, cm.accelerator
    link = (accelerator.interconnect_gbps or 64) * 1e9 / 2
    custom = engine.custom_all_reduce
    usable = custom is not None and world in custom.worlds and (accelerator.link == "nvlink" or world == 2)
    nccl = engine.nccl

    scale = cm.scales.get("all_reduce", 1.0)  # in situ vs the benchmarks the algorithms were set from

    def collective(c, moved: float) -> float:
        return scale * (c.base_s + c.per_hop_s * (world - 1) + moved / (c.link_efficiency * link))

    def time(nbytes: int) -> float:
        if usable and nbytes < custom.max_bytes:
            if nbytes < custom.one_shot_below.get(world, 0):
                return collective(custom.one_shot, (world - 1) * nbytes)
            return collective(custom.two_shot, 2 * (world - 1) / world * nbytes)
        if nccl is None:
            raise ValueError(f"engine {engine.id} has no NCCL all-reduce for {world} GPUs over {accelerator.link}")
        return collective(nccl, 2 * (world - 1) / world * nbytes)
    return Formula(time, "extrapolated", cm.errors.get("by_curve", {}).get("all_reduce", cm.unvalidated_error))


def all_to_all(cm: CostReader, world: int) -> Source:
    """Each rank sends nbytes in all, an even share to every rank: (w-1)/w of them over each link."""
    return _collective(cm, "all_to_all", world, lambda nbytes: (world - 1) / world * nbytes)


def kv_ring(cm: CostReader, world: int) -> Source:
    """One hop of context parallelism's ring: every rank sends nbytes to the next rank and receives
    as many from the one before, at once, so each link carries nbytes (engine/context_parallel.py)."""
    return _collective(cm, "kv_ring", world, lambda nbytes: nbytes)


def moe_dispatch(cm: CostReader, num_experts: int, top_k: int, hidden: int, dtype: str) -> Source:
    """Router scores, top-k, grouping the (token, expert) rows by expert and the weighted sum back
    (engine/moe.py without the experts): measured where profiled, otherwise the router GEMM and
    two passes over the rows."""
    series = cm.series(("moe_dispatch", num_experts, top_k, hidden, dtype))
    if series is not None:
        return Measured(series, cm.errors)
    return Formula(lambda tokens: (cm.predict("gemm", tokens, num_experts, hidden, dtype, "router").time_s
                                   + 2 * cm.predict("elementwise", "add", tokens * top_k, hidden, dtype).time_s),
                   "extrapolated", cm.unvalidated_error)


def moe_experts(cm: CostReader, num_experts: int, top_k: int, routing_skew: float, ranks: int, hidden: int,
                ffn: int, dtype: str, weight_dtype: str | None) -> Source:
    """Size: the step's tokens; the experts' expected load at that count (simulator/cost/moe.py)."""
    def predict(tokens: int) -> Prediction:
        load = step_load(tokens, num_experts, top_k, routing_skew, ranks)
        return moe_experts_prediction(cm, load.rows_per_expert, load.active_experts, hidden, ffn, dtype, weight_dtype)
    return Composite(predict)


def moe_experts_prediction(cm: CostReader, rows_per_expert: float, active: float, hidden: int, ffn: int, dtype: str,
                           weight_dtype: str | None = None) -> Prediction:
    """One MoE layer's routed experts: `active` experts each computing its SwiGLU MLP (hidden ->
    ffn -> hidden) over rows_per_expert rows. Measured (moe_experts, per number of active experts
    over rows per expert, interpolated between measured expert counts) where the profile has this
    shape in this dtype -- servecast's engine runs a GEMM per expert; otherwise grouped GEMMs over
    all the experts' rows."""
    if active <= 0:
        return Prediction(0.0, "measured", 0.0)
    rows = max(1.0, rows_per_expert)  # fractional: some experts get one row more than others
    shape = (hidden, ffn, dtype)  # the numbers of active experts measured at this shape, ascending
    measured = sorted(key[1] for key in cm.series_keys() if key[0] == "moe_experts" and key[2:] == shape) \
        if weight_dtype in (None, dtype) else None
    if measured:
        t, provenance = across_counts(measured, active,
                                      lambda a: cm.series(("moe_experts", a, hidden, ffn, dtype)).at(rows),
                                      scale_below=True)
        return Prediction(t, provenance, cm.errors[provenance])
    # Serving stacks run a layer's experts as grouped GEMMs (vLLM's fused_moe: one kernel over
    # every expert's rows), not a kernel per expert: two operators whose work is all the rows'
    # FLOPs and the touched experts' weights.
    total_rows = rows_per_expert * active
    weight_bytes = WEIGHT_BYTES.get(weight_dtype or dtype, DTYPE_BYTES[dtype])
    element = DTYPE_BYTES[dtype]
    t = 0.0
    for name, (n, k) in (("gate_up_proj", (2 * ffn, hidden)), ("down_proj", (hidden, ffn))):
        flops = 2.0 * total_rows * n * k
        nbytes = active * n * k * weight_bytes + total_rows * (n + k) * element
        t += cm.modeled(curve_key("gemm", name), dtype, lambda _: (flops, nbytes), family="moe").time(0)
    t += cm.predict("elementwise", "swiglu", max(1, round(total_rows)), ffn, dtype).time_s
    return Prediction(t, "extrapolated", cm.unvalidated_error)


def step_overhead(cm: CostReader) -> Source:
    series = cm.series(("step_overhead",))
    if series is not None:
        return Measured(series, cm.errors)
    return Formula(lambda batch: 0.0, "extrapolated", 0.0)


def kv_dequant_timer(cm: CostReader, kv_dtype: str | None, kv_heads: int, head_dim: int,
                     dtype: str) -> Callable[[int], float] | None:
    """Extra seconds of reading `tokens` tokens' K and V of one layer from a quantized cache (int8 /
    fp8: gather and dequantize) over reading them from a plain one, from the profile's kv_gather
    points; None when the cache is not quantized or the profile lacks them."""
    if kv_dtype not in ("int8", "fp8"):
        return None
    quantized = cm.series(("kv_gather", kv_heads, head_dim, dtype, kv_dtype))
    plain = cm.series(("kv_gather", kv_heads, head_dim, dtype, "none"))
    if quantized is None or plain is None:
        return None
    return lambda tokens: max(0.0, quantized.at(max(1, tokens))[0] - plain.at(max(1, tokens))[0])


BUILDERS: dict[str, Callable[..., Source | None]] = {
    "gemm": gemm, "attention_prefill": attention_prefill, "attention_decode": attention_decode,
    "attention_verify": attention_verify, "elementwise": elementwise, "kv_write": kv_write, "sample": sample,
    "all_reduce": all_reduce, "all_to_all": all_to_all, "kv_ring": kv_ring, "moe_dispatch": moe_dispatch, "moe_experts": moe_experts,
    "step_overhead": step_overhead,
}
