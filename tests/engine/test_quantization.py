"""Quantization: every kernel computes the dequantized weights (exactly where its activations stay
in the model's dtype), in a layer and through the whole engine; kernels are chosen per row bucket
by measurement or pinned; bytes as allocated shrink as they should."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import LLMEngine, SamplingParams
from engine.linear import Linear
from engine.quant_kernels import BUCKETS, KERNELS, KernelChoice, candidates, widen_codes
from engine.quantization import dequantize, quantize_weight
from tests.device import ON_CUDA, TEST_DEVICE, engine_config

MODEL = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
MODES = [("int8", 128), ("int4", 32), ("int4", 128), ("fp8", 128)] + ([] if ON_CUDA else [("w8a8", 128)])
# Every kernel that can compute a mode on the test device, with its group sizes.
KERNEL_CASES = [(mode, group, k.name) for mode, group in MODES
                for k in candidates(mode, torch.device(TEST_DEVICE), torch.float32)]
# How close a kernel comes to a float GEMM on the dequantized weight, by what it computes the
# activations in: the model's dtype (float rounding only), bfloat16, or int8 codes.
TOLERANCE = {"model": 1e-5, "bfloat16": 1e-2, "int8": 3e-2}


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.mark.parametrize("mode, group, kernel", KERNEL_CASES)
def test_every_kernel_computes_its_dequantized_weight(mode, group, kernel) -> None:
    torch.manual_seed(0)
    layer = Linear(256, 96, bias=True).to(TEST_DEVICE)
    weight = layer.weight.detach().clone()
    x = torch.randn(9, 256, device=TEST_DEVICE)
    stored = dequantize(quantize_weight(weight, mode, group))  # a packed copy may replace the layer's own
    layer.quantize(mode, group, kernel)
    assert layer.quantized.choice.kernels == (kernel,) * len(BUCKETS)
    expected = F.linear(x, stored, layer.bias)
    error = relative_error(layer(x), expected)
    assert error < TOLERANCE[KERNELS[kernel].activations]
    if KERNELS[kernel].activations == "model":
        assert torch.allclose(layer(x), expected, rtol=1e-4, atol=1e-5)
    weight_error = relative_error(stored, weight)
    assert 0 < weight_error < {"int8": 0.01, "w8a8": 0.01, "fp8": 0.05, "int4": 0.15}[mode]  # a real approximation


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fp8_codes_widen_exactly(dtype) -> None:
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F].view(torch.float8_e4m3fn)  # every code but NaN, subnormals included
    assert torch.equal(widen_codes(codes, dtype), codes.to(dtype))
    assert torch.equal(widen_codes(codes.view(torch.int8), dtype), codes.view(torch.int8).to(dtype))


def test_a_measured_choice_is_a_candidate_per_bucket_made_once_per_shape() -> None:
    torch.manual_seed(2)
    first, second = Linear(128, 64, bias=False), Linear(128, 64, bias=False)
    first.quantize("int8")
    second.quantize("int8")
    names = {k.name for k in candidates("int8", torch.device("cpu"), torch.float32)}
    assert set(first.quantized.choice.kernels) <= names
    assert second.quantized.choice is first.quantized.choice  # measured once for the shape
    for rows in (1, 3, 16, 17, 1000):
        bucket = next((i for i, b in enumerate(BUCKETS) if rows <= b), len(BUCKETS) - 1)
        assert first.quantized.choice.for_rows(rows) == first.quantized.choice.kernels[bucket]


def test_a_choice_reads_back_from_its_description_and_never_mixes_weight_copies() -> None:
    mixed = KernelChoice(("int8pack-bf16", "int8pack-bf16", "int8pack", "dequantize-int8", "dequantize-int8"))
    assert mixed.describe() == "int8pack-bf16 <=4, int8pack <=16, dequantize-int8"
    assert KernelChoice.parse(mixed.describe()) == mixed
    assert KernelChoice.parse("tinygemm").kernels == ("tinygemm",) * len(BUCKETS)
    with pytest.raises(ValueError, match="unknown quantized kernel"):
        KernelChoice.parse("magic <=4, int8pack")
    layer = Linear(512, 2048, bias=False)
    layer.quantize("w8a8")  # fbgemm and oneDNN each keep their own packed copy: one of them serves every bucket
    assert len(set(layer.quantized.choice.kernels)) == 1
    assert layer.quantized.data.numel() == 0  # and the packed copy replaced the stored weight


def test_a_kernel_is_offered_only_the_shapes_it_computes() -> None:
    """torch's int8-weight GEMM crashes on bfloat16 rows whose width is no multiple of 16 (a
    tensor-parallel shard's, say): such a layer runs another kernel."""
    torch.manual_seed(3)
    layer = Linear(344, 16, bias=False)
    weight = layer.weight.detach().clone()
    layer.quantize("int8")
    assert "int8pack-bf16" not in layer.quantized.choice.kernels
    x = torch.randn(3, 344)
    assert torch.allclose(layer(x), F.linear(x, dequantize(quantize_weight(weight, "int8"))), rtol=1e-4, atol=1e-5)


def test_a_pinned_kernel_must_compute_the_mode_here() -> None:
    with pytest.raises(ValueError, match="cannot compute int8 here.*use one of"):
        Linear(64, 32).quantize("int8", kernel="int4pack")
    with pytest.raises(ValueError, match="set quantization too"):
        engine_config(quant_kernel="int8pack")


# The kernels that compute in the model's dtype: the engine then equals its dequantized self.
EXACT = {"int8": "dequantize-int8" if ON_CUDA else "int8pack", "int4": "tinygemm" if ON_CUDA else "int4pack",
         "fp8": "dequantize-fp8", "w8a8": "fbgemm-w8a8"}


@pytest.mark.parametrize("mode, group", MODES)
def test_the_engine_computes_the_dequantized_model(mode, group) -> None:
    """Prompt logits of the quantized engine equal those of the same engine with every quantized
    weight replaced by its float value (the kernels, through attention, paging and sampling)."""
    kernel = EXACT[mode]
    engine = LLMEngine.from_config(MODEL, engine_config(num_blocks=64, quantization=mode, quant_group_size=group,
                                                        quant_kernel=kernel))
    prompt = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]]
    params = SamplingParams(max_tokens=1, temperature=0.0, return_prompt_logits=True)
    quantized = engine.generate(prompt, params)[0].prompt_logits
    assert set(engine.model.quant_kernels().values()) == {kernel}
    for m in engine.model.modules():
        if isinstance(m, Linear) and m.quantized is not None:
            m.weight = torch.nn.Parameter(dequantize(m.quantized), requires_grad=False)
            m.quantized = None
    floats = engine.generate(prompt, params)[0].prompt_logits
    if KERNELS[kernel].activations != "model":  # bfloat16 or int8 activations through each layer
        assert relative_error(quantized, floats) < 3e-2
    else:
        assert torch.allclose(quantized, floats, rtol=1e-3, atol=1e-4)


def test_weight_bytes_as_allocated() -> None:
    full = LLMEngine.from_config(MODEL, engine_config(num_blocks=16)).model
    embedding = MODEL["vocab_size"] * MODEL["hidden_size"] * 4
    norms = sum(p.numel() * 4 for n, p in full.named_parameters() if "norm" in n)
    linear_weights = sum(m.weight.numel() for m in full.modules() if isinstance(m, Linear))
    rows = sum(m.out_features for m in full.modules() if isinstance(m, Linear))
    assert full.weight_bytes() == embedding + norms + 4 * linear_weights
    int8 = LLMEngine.from_config(MODEL, engine_config(num_blocks=16, quantization="int8",
                                                      quant_kernel=EXACT["int8"])).model
    assert int8.weight_bytes() == embedding + norms + linear_weights + 4 * rows  # a byte each, a scale per row
    int4 = LLMEngine.from_config(MODEL, engine_config(num_blocks=16, quantization="int4", quant_group_size=32,
                                                      quant_kernel=EXACT["int4"])).model
    scale_bytes = 2 if ON_CUDA else 4  # CUDA's int4 kernel reads bfloat16 scales and zeros
    assert int4.weight_bytes() == embedding + norms + linear_weights // 2 + 2 * scale_bytes * (linear_weights // 32)


def test_bad_quantization_settings() -> None:
    with pytest.raises(ValueError, match="not supported"):
        engine_config(quantization="int3")
    with pytest.raises(ValueError, match="group size must be one of"):
        engine_config(quantization="int4", quant_group_size=48)
    with pytest.raises(ValueError, match="multiple of it"):
        LLMEngine.from_config(dict(MODEL, intermediate_size=224), engine_config(quantization="int4",
                                                                               quant_group_size=128))


@pytest.mark.parametrize("kv_dtype, tolerance", [("int8", 0.02), ("fp8", 0.08)])
def test_a_quantized_kv_cache_stays_close_and_takes_a_quarter_of_the_bytes(kv_dtype, tolerance) -> None:
    """Decode reads every earlier token's K/V from the cache: logits of a long continuation stay
    close to the float cache's, and the pool holds a byte per value plus a scale per token and head."""
    prompt = [[(7 * i) % 250 + 1 for i in range(40)]]
    params = SamplingParams(max_tokens=1, temperature=0.0, return_prompt_logits=True)
    config = dict(num_blocks=64, max_num_batched_tokens=8)  # chunked prefill: later chunks read the cache
    reference = LLMEngine.from_config(MODEL, engine_config(**config))
    quantized = LLMEngine.from_config(MODEL, engine_config(kv_cache_dtype=kv_dtype, **config))
    a = reference.generate(prompt, params)[0].prompt_logits
    b = quantized.generate(prompt, params)[0].prompt_logits
    assert 0 < (a - b).norm() / a.norm() < tolerance
    head_dim = MODEL["hidden_size"] // MODEL["num_attention_heads"]
    ratio = quantized.runner.cache.nbytes / reference.runner.cache.nbytes
    assert ratio == pytest.approx((head_dim + 4) / (4 * head_dim))


def test_bad_kv_cache_dtype() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        engine_config(kv_cache_dtype="int4")
