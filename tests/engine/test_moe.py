"""Mixture-of-experts feed-forward: batched dispatch, parameter counts, config errors. (Equality
with transformers' Mixtral and Qwen2-MoE is in test_engine_parity.py; EP=2 in
test_tensor_parallel.py.)"""

from __future__ import annotations

import pytest
import torch

from engine import LLMEngine, SamplingParams
from engine.policy.config import ModelConfig
from engine.mlp import MLP
from engine.moe import SparseMoE
from tests.device import engine_config
from tests.tiny_models import hf_config, hf_model, random_prompts


def test_one_gemm_per_expert_that_got_tokens_not_one_per_token(monkeypatch) -> None:
    engine = LLMEngine.from_hf(hf_model("mixtral-moe"), engine_config(block_size=4, num_blocks=128,
                                                                     max_num_batched_tokens=128))
    moe_layers = [m for m in engine.model.modules() if isinstance(m, SparseMoE)]
    assert len(moe_layers) == 2
    calls: list[int] = []
    original = MLP.forward

    def counting(self, x):
        calls.append(x.shape[0])
        return original(self, x)

    monkeypatch.setattr(MLP, "forward", counting)  # the experts (Mixtral has no dense MLP or shared expert)
    prompts = random_prompts([40, 33, 25], seed=3)  # 98 prompt tokens in one step
    engine.generate(prompts, SamplingParams(max_tokens=1, temperature=0.0))
    # One prefill step: each layer calls each of its 8 experts at most once, over rows that add up
    # to every token's top-2 choices.
    assert len(calls) <= 2 * 8
    assert sum(calls) == 2 * 98 * 2


def test_router_weights_are_transformers_topk() -> None:
    config = ModelConfig.from_hf(hf_config("qwen2moe-shared"))
    assert config.sparse_layers == (True, False) and not config.norm_topk_prob
    moe = SparseMoE(config)
    torch.nn.init.normal_(moe.gate)
    x = torch.randn(5, config.hidden_size)
    weights, experts = moe.route(x)
    probs = torch.softmax(x @ moe.gate.T, dim=-1)
    assert torch.allclose(weights, probs.gather(1, experts))  # not renormalized for Qwen2-MoE
    assert (probs.gather(1, experts).min(dim=1).values >= probs.topk(4).values[:, -1] - 1e-7).all()


@pytest.mark.parametrize("name", ["mixtral-moe", "qwen2moe-shared"])
def test_parameter_count_matches_transformers(name: str) -> None:
    model = hf_model(name)
    assert ModelConfig.from_hf(model.config).num_parameters() == sum(p.numel() for p in model.parameters())


def test_bad_expert_counts_are_refused_with_the_fix() -> None:
    raw = hf_config("mixtral-moe").to_dict()
    raw["num_experts_per_tok"] = 9
    with pytest.raises(ValueError, match="num_experts_per_tok=9 must be between 1 and the 8 experts"):
        ModelConfig.from_hf(raw)


def test_the_engine_counts_rows_per_expert_and_the_skew_fit_reads_them() -> None:
    from simulator.cost.moe import expert_shares, fit_routing_skew

    engine = LLMEngine.from_hf(hf_model("mixtral-moe"), engine_config(block_size=4, num_blocks=128))
    prompts = random_prompts([12, 30, 7], seed=5)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    load = engine.expert_load()
    computed = sum(len(p) for p in prompts) + sum(len(o.output_token_ids) - 1 for o in outputs)
    assert len(load) == 2 and all(sum(layer) == 2 * computed for layer in load)
    # The fit recovers the exponent of Zipf-shaped loads, and finds uniform loads unskewed.
    assert fit_routing_skew([round(1e6 * s) for s in expert_shares(8, 1.3)]) == pytest.approx(1.3, abs=0.01)
    assert fit_routing_skew([100] * 8) == pytest.approx(0.0, abs=0.01)


def test_experts_are_quantized_and_the_router_stays_float() -> None:
    # Weight-only int8 applies to every expert's projections (engine Linear layers); the router is a
    # float parameter, so which experts a token goes to barely moves.
    params = SamplingParams(max_tokens=1, temperature=0.0, return_prompt_logits=True)
    prompt = random_prompts([24], seed=9)
    logits = {}
    for mode in (None, "int8"):
        engine = LLMEngine.from_hf(hf_model("qwen2moe-shared"), engine_config(block_size=4, num_blocks=64,
                                                                           quantization=mode))
        moe = next(m for m in engine.model.modules() if isinstance(m, SparseMoE))
        assert all((e.gate_up_proj.quantized is not None) == (mode == "int8") for e in moe.experts)
        assert (moe.shared_expert.down_proj.quantized is not None) == (mode == "int8")
        assert moe.gate.dtype == torch.float32
        logits[mode] = engine.generate(prompt, params)[0].prompt_logits
    cosine = torch.nn.functional.cosine_similarity(logits[None], logits["int8"], dim=-1)
    assert cosine.min() > 0.999
