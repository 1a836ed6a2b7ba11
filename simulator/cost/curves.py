"""Which roofline x efficiency curve times an operator, and the work (FLOPs, bytes) a measured
operator did. No torch.

Curves are keyed by operator family ('gemm', 'attention_decode', 'memory', ...) and, where an
operator has one of its own, by name or head dim ('gemm:qkv_proj', 'attention_decode:hd128').
An operator without a curve of its own is timed by the next one down its fallback chain.
"""

from __future__ import annotations

from simulator.catalog.hardware import canonical_dtype
from simulator.cost.efficiency import (decode_attention_work, elementwise_work, gemm_work, kv_write_work,
                                       prefill_attention_work)
from simulator.cost.profile_format import Measurement

# When an operator has no curve of its own, the next one down this chain is used.
FALLBACK = {"attention_prefill": "attention", "attention_decode": "attention", "attention": "gemm",
            "kv_write": "memory", "sample": "memory"}


def curve_key(op: str, name: str | None = None, head_dim: int | None = None) -> str:
    if op in ("gemm", "elementwise") and name:
        return f"{op}:{name}"
    if op in ("attention_prefill", "attention_decode") and head_dim:
        return f"{op}:hd{head_dim}"
    return op


def fallback(key: str) -> str | None:
    if key.startswith("gemm:"):
        return "gemm"
    if key.startswith("elementwise:"):
        return "memory"
    if key.startswith("attention_") and ":" in key:
        return key.split(":")[0]
    return FALLBACK.get(key)


def additive(key: str) -> bool:
    """The engine's attention gathers K/V and then computes on them: the two sides add up. A GEMM
    streams and computes at once: the slower side decides."""
    return key.startswith("attention")


def streams(key: str) -> bool:
    """GEMMs and streaming ops (norms, adds, KV writes, sampling) read working sets whose size
    decides whether they come from cache or DRAM: they see the size-dependent bandwidth.
    Attention gathers then computes at step sizes dominated by per-call costs that the curves'
    overhead term carries: the single bandwidth."""
    return key.startswith(("gemm", "elementwise")) or key in ("kv_write", "memory", "sample")


def work_of(m: Measurement) -> tuple[float, float] | None:
    """(FLOPs, bytes) of a measured operator, or None for ops outside the roofline model."""
    p = dict(m.params)
    dtype = canonical_dtype(p["dtype"]) if "dtype" in p else "fp32"
    if m.op == "gemm":
        return gemm_work(p["m"], p["n"], p["k"], dtype)
    if m.op == "attention_prefill":
        return prefill_attention_work(p["q_len"], p["kv_len"], p["num_heads"], p["num_kv_heads"], p["head_dim"], dtype)
    if m.op == "attention_decode":
        return decode_attention_work([p["kv_len"]] * p["batch"], p["num_heads"], p["num_kv_heads"], p["head_dim"],
                                     dtype)
    if m.op == "elementwise":
        return elementwise_work(p["tokens"], p["width"], dtype)
    if m.op == "kv_write":
        return kv_write_work(p["tokens"], p["num_kv_heads"], p["head_dim"], dtype)
    if m.op == "sample":
        return elementwise_work(p["batch"], p["vocab"], "fp32")
    return None


def curve_keys_of(m: Measurement) -> list[str]:
    """The curves a measurement helps fit: its own, and the family ones it falls back to."""
    params = dict(m.params)
    own = curve_key(m.op, m.name if m.op == "gemm" else params.get("name"), params.get("head_dim"))
    keys = [own]
    while (nxt := fallback(keys[-1])) is not None and nxt not in keys:
        if nxt == "gemm" and m.op != "gemm":
            break  # attention falls back on the GEMM curve when predicting, but must not train it
        keys.append(nxt)
    return keys
