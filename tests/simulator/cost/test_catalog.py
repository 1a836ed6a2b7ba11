"""Hardware and model catalogs."""

from __future__ import annotations

import pytest

from simulator.catalog import catalog_model_ids, get_accelerator, load_hardware, load_model

REQUIRED_HARDWARE = {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "l40s", "l4", "a10g",
                     "mi300x", "gaudi3", "tpu-v5e", "cpu-local", "cuda-local"}
REQUIRED_MODELS = {"llama-2-7b", "llama-2-13b", "llama-2-70b", "codellama-34b", "llama-3.1-8b", "llama-3.1-70b",
                   "llama-3.1-405b", "mistral-7b", "mistral-nemo", "mixtral-8x7b", "mixtral-8x22b", "qwen2.5-7b",
                   "qwen2.5-72b", "qwen3-14b", "yi-34b"}


def test_hardware_catalog_has_the_accelerators_with_sane_facts() -> None:
    catalog = load_hardware()
    assert REQUIRED_HARDWARE <= set(catalog)
    for acc in catalog.values():
        if acc.profiled:
            continue
        assert acc.memory_gb > 0 and acc.memory_bandwidth > 0
        assert acc.peak_flops("bf16") > 0
    h100 = get_accelerator("h100-sxm")
    assert h100.peak_flops("fp8") == pytest.approx(2 * h100.peak_flops("bf16"), rel=0.01)
    assert get_accelerator("h200").memory_gb == 141
    with pytest.raises(ValueError, match="no fp8 peak"):
        get_accelerator("a100-80gb").peak_flops("fp8")


def test_user_hardware_file_adds_and_replaces(tmp_path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("my-gpu:\n  name: My GPU\n  vendor: acme\n  memory_gb: 64\n  memory_bandwidth_gbps: 1000\n"
                    "  peak_tflops: {bf16: 200}\n  price_per_hour_usd: 1.0\n"
                    "l4:\n  name: L4 (negotiated)\n  vendor: nvidia\n  memory_gb: 24\n  memory_bandwidth_gbps: 300\n"
                    "  peak_tflops: {bf16: 121}\n  price_per_hour_usd: 0.5\n")
    catalog = load_hardware(path)
    assert catalog["my-gpu"].peak_flops("bfloat16") == 200e12
    assert catalog["l4"].price_per_hour_usd == 0.5 and "h100-sxm" in catalog


@pytest.mark.parametrize("text, message", [
    ("x:\n  name: X\n  vendor: v\n  memory_gb: -1\n", "memory_gb"),
    ("x:\n  name: X\n  vendor: v\n  peak_tflops: {bf16: .nan}\n", "peak"),
    ("x:\n  name: X\n  vendor: v\n  colour: red\n", "colour"),
    ("x: [1, 2\n", "not valid YAML"),
])
def test_bad_hardware_files_are_rejected(tmp_path, text, message) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_hardware(path)
    with pytest.raises(ValueError, match="unknown hardware"):
        get_accelerator("nope")


def test_model_catalog_parameter_counts() -> None:
    assert REQUIRED_MODELS <= set(catalog_model_ids())
    # Published parameter counts (billions).
    expected = {"llama-2-7b": 6.74, "llama-2-70b": 68.98, "llama-3.1-8b": 8.03, "llama-3.1-405b": 405.9,
                "mixtral-8x7b": 46.7, "qwen2.5-7b": 7.62, "mistral-7b": 7.24}
    for model_id, billions in expected.items():
        assert load_model(model_id).num_parameters() / 1e9 == pytest.approx(billions, rel=0.01)
    mixtral = load_model("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2)


@pytest.mark.parametrize("model_id, total, active, tolerance", [
    # Published total / active parameters (billions). Llama 4 Scout's 109 B include its vision
    # encoder, which the text model here leaves out; DeepSeek's MLA is modeled as a KV head pair of
    # its latent's width (the module docstring), a few hundred million more attention weights.
    ("mixtral-8x7b", 46.7, 12.9, 0.01), ("mixtral-8x22b", 141.0, 39.0, 0.01),
    ("qwen1.5-moe-a2.7b", 14.3, 2.7, 0.01), ("llama-4-scout", 109.0, 17.0, 0.03),
    ("deepseek-v2-lite", 15.7, 2.4, 0.2),
    # Qwen's cards: 30.5 B / 3.3 B and 235 B / 22 B, embeddings counted. gpt-oss: OpenAI's 20.9 B / 3.6 B
    # and 116.8 B / 5.1 B leave out the input embedding (201,088 x 2,880 = 0.58 B), counted here.
    ("qwen3-30b-a3b", 30.5, 3.35, 0.01), ("qwen3-235b-a22b", 235.1, 22.2, 0.01),
    ("gpt-oss-20b", 20.9, 3.6 + 0.58, 0.01), ("gpt-oss-120b", 116.8, 5.1 + 0.58, 0.01)])
def test_moe_catalog_models_count_all_experts_and_the_active_ones(model_id, total, active, tolerance) -> None:
    spec = load_model(model_id)
    assert spec.is_moe
    assert spec.num_parameters() / 1e9 == pytest.approx(total, rel=tolerance)
    assert spec.active_parameters() / 1e9 == pytest.approx(active, rel=tolerance)


def test_any_hf_config_json_loads(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2, '
                                          '"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, '
                                          '"intermediate_size": 128, "vocab_size": 100}')
    spec = load_model(tmp_path)
    assert spec.head_dim == 32 and spec.linear_shapes()["qkv_proj"] == (4 * 32 + 2 * 2 * 32, 64)
    with pytest.raises(ValueError, match="unknown model"):
        load_model("gpt-17")
