"""Number formats: their canonical names and bytes. The one table, torch-free: the engine, the
memory plan and the cost model all read it."""

from __future__ import annotations

# Every spelling accepted for a format -> its canonical name.
DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                 "fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "int8": "int8",
                 "fp4": "fp4"}  # fp4: a tensor-core peak only (no element size below: nothing computes in it here)
# Bytes of one element (activations, KV cache entries, unquantized weights).
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
# Bytes per stored weight: the element's, and int4's packed nibbles plus a 16-bit scale and zero
# point per group of 128.
# w8a8: int8 weights (and int8 activations, which change the GEMM's speed, not the weights' bytes).
# mxfp4 (OCP MX): 4-bit E2M1 values, one 8-bit power-of-two scale per 32: 4.25 bits. nvfp4: 4-bit
# values, one FP8 E4M3 scale per 16: 4.5 bits (its per-tensor fp32 scale left out).
WEIGHT_BYTES = {**{name: float(size) for name, size in DTYPE_BYTES.items()}, "int4": 0.5 + 4 / 128, "w8a8": 1.0,
                "mxfp4": 4.25 / 8, "nvfp4": 4.5 / 8}
# Formats that quantize only a MoE model's routed experts; every other weight stays 16-bit. vLLM's
# Mxfp4Config gives its linear layers UnquantizedLinearMethod and FusedMoE the MXFP4 method (gpt-oss
# ships so: attention, router, embeddings and LM head in bf16).
EXPERT_ONLY_WEIGHTS = frozenset({"mxfp4"})
# What the engine computes in (torch's names).
ENGINE_DTYPES = ("float32", "bfloat16", "float16")


def canonical_dtype(dtype: str) -> str:
    try:
        return DTYPE_ALIASES[dtype.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}: use one of fp32, bf16, fp16, fp8, int8") from None


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of a format in any spelling."""
    return DTYPE_BYTES[canonical_dtype(dtype)]
