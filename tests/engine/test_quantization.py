"""Weight-only quantization: torch's packed kernels compute exactly the dequantized weights, in a
layer and through the whole engine; bytes as allocated shrink as they should."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from engine import LLMEngine, SamplingParams
from engine.linear import Linear
from engine.quantization import dequantize, quantize_weight, quantized_matmul
from tests.device import ON_CUDA, TEST_DEVICE, engine_config

MODEL = dict(model_type="llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)
MODES = [("int8", 128), ("int4", 32), ("int4", 128), ("fp8", 128)]


@pytest.mark.parametrize("mode, group", MODES)
def test_a_quantized_layer_computes_its_dequantized_weight(mode, group) -> None:
    torch.manual_seed(0)
    layer = Linear(256, 96, bias=True).to(TEST_DEVICE)
    weight = layer.weight.detach().clone()
    x = torch.randn(9, 256, device=TEST_DEVICE)
    layer.quantize(mode, group)
    if ON_CUDA and mode == "int4":  # tinygemm takes and returns bfloat16 activations
        expected = F.linear(x.bfloat16().float(), dequantize(layer.quantized), layer.bias)
        assert torch.allclose(layer(x), expected, rtol=2e-2, atol=2e-2)
    else:
        expected = F.linear(x, dequantize(layer.quantized), layer.bias)
        assert torch.allclose(layer(x), expected, rtol=1e-4, atol=1e-5)
    error = (dequantize(layer.quantized) - weight).norm() / weight.norm()
    assert error < {"int8": 0.01, "fp8": 0.05, "int4": 0.15}[mode]  # and it is a real approximation
    assert error > 0


def test_int8_dequantized_at_use_equals_the_packed_kernel() -> None:
    """CUDA computes int8 layers by dequantizing at use (torch's CUDA int8 GEMM measured far
    slower); that path gives the packed kernel's result."""
    torch.manual_seed(1)
    weight, x = torch.randn(64, 128), torch.randn(5, 128)
    packed = quantize_weight(weight, "int8")
    expected_kernel = "dequantize" if ON_CUDA else "packed"
    assert packed.kernel == expected_kernel
    at_use = dataclasses.replace(packed, kernel="dequantize")
    other = dataclasses.replace(packed, kernel="packed" if ON_CUDA else "dequantize")
    assert torch.allclose(quantized_matmul(x, at_use), quantized_matmul(x, other), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode, group", MODES)
def test_the_engine_computes_the_dequantized_model(mode, group) -> None:
    """Prompt logits of the quantized engine equal those of the same engine with every quantized
    weight replaced by its float value (the kernels, through attention, paging and sampling)."""
    engine = LLMEngine.from_config(MODEL, engine_config(num_blocks=64, quantization=mode, quant_group_size=group))
    prompt = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]]
    params = SamplingParams(max_tokens=1, temperature=0.0, return_prompt_logits=True)
    quantized = engine.generate(prompt, params)[0].prompt_logits
    for m in engine.model.modules():
        if isinstance(m, Linear) and m.quantized is not None:
            m.weight = torch.nn.Parameter(dequantize(m.quantized), requires_grad=False)
            m.quantized = None
    floats = engine.generate(prompt, params)[0].prompt_logits
    if ON_CUDA and mode == "int4":  # bfloat16 activations through each int4 layer
        assert (quantized - floats).norm() / floats.norm() < 2e-2
    else:
        assert torch.allclose(quantized, floats, rtol=1e-3, atol=1e-4)


def test_weight_bytes_as_allocated() -> None:
    full = LLMEngine.from_config(MODEL, engine_config(num_blocks=16)).model
    embedding = MODEL["vocab_size"] * MODEL["hidden_size"] * 4
    norms = sum(p.numel() * 4 for n, p in full.named_parameters() if "norm" in n)
    linear_weights = sum(m.weight.numel() for m in full.modules() if isinstance(m, Linear))
    rows = sum(m.out_features for m in full.modules() if isinstance(m, Linear))
    assert full.weight_bytes() == embedding + norms + 4 * linear_weights
    int8 = LLMEngine.from_config(MODEL, engine_config(num_blocks=16, quantization="int8")).model
    assert int8.weight_bytes() == embedding + norms + linear_weights + 4 * rows  # a byte each, a scale per row
    int4 = LLMEngine.from_config(MODEL, engine_config(num_blocks=16, quantization="int4", quant_group_size=32)).model
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
