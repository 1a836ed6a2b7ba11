"""What a whole step costs beyond its operators: the framework terms (fitted in calibrate/ on
measured whole steps) and the features they scale with. No torch."""

from __future__ import annotations

import math

from simulator.catalog.models import ModelSpec
from simulator.cost.moe import step_load

FRAMEWORK_TERMS = ("operator_scale", "step_s", "step_per_chunk_s", "step_per_prefill_s", "step_per_group_s",
                   "step_per_token_s", "layer_s", "layer_per_chunk_s", "layer_per_prefill_s", "layer_per_group_s",
                   "layer_per_token_s")
# A speculative verification step's own overhead (per step and per layer: in situ it follows the
# draft's forwards, which evict the target's weights from the caches). Fitted only where
# verification steps were observed (calibrate/fitting/spec_steps.py), zero otherwise.
VERIFY_TERMS = ("step_per_verify_s", "layer_per_verify_s")
# A mixture-of-experts layer's host work beyond its operators (the engine's per-expert loop: Python
# and dispatch per layer and per expert touched). Fitted only where MoE steps were observed.
MOE_TERMS = ("moe_layer_s", "moe_layer_per_expert_s")
# A step whose token count differs from the step just before it (no idle between) takes longer
# than the same step repeated, which is how the profile times its whole forwards: a part per
# halving of the token count (a small step after a large one: caches refilled) and a part per
# doubling (a large step after a small one), fitted apart (docs/architecture.md, the fit's
# history in the commit log). Fitted only where engine steps were observed in order (the
# validation's calibration replays), zero otherwise.
SHAPE_CHANGE_TERMS = ("step_per_halving_s", "step_per_doubling_s")


def framework_overhead(f: dict[str, float], num_chunks: int, prefill_chunks: int, decode_groups: int, tokens: int,
                       layers: int, verifying: int = 0, moe: tuple[float, float] = (0.0, 0.0)) -> float:
    """The additive terms of CostModel.framework (per step, and per layer); moe: moe_host_features."""
    t = (f["step_s"] + f["step_per_chunk_s"] * num_chunks + f["step_per_prefill_s"] * prefill_chunks
         + f["step_per_group_s"] * decode_groups + f["step_per_token_s"] * tokens
         + layers * (f["layer_s"] + f["layer_per_chunk_s"] * num_chunks + f["layer_per_prefill_s"] * prefill_chunks
                     + f["layer_per_group_s"] * decode_groups + f["layer_per_token_s"] * tokens))
    if verifying and "step_per_verify_s" in f:
        t += f["step_per_verify_s"] + layers * f["layer_per_verify_s"]
    if moe[0] and "moe_layer_s" in f:
        t += f["moe_layer_s"] * moe[0] + f["moe_layer_per_expert_s"] * moe[1]
    return t


def shape_change_features(previous_tokens: int | None, tokens: int) -> tuple[float, float]:
    """What SHAPE_CHANGE_TERMS scale with: (halvings, doublings) of the token count from the
    previous step's, one of them zero; (0, 0) without a previous step or without a change."""
    if previous_tokens is None or previous_tokens == tokens or previous_tokens <= 0 or tokens <= 0:
        return 0.0, 0.0
    if previous_tokens > tokens:
        return math.log2(previous_tokens / tokens), 0.0
    return 0.0, math.log2(tokens / previous_tokens)


def moe_host_features(model: ModelSpec, tokens: int) -> tuple[float, float]:
    """What MOE_TERMS scale with: the MoE layers, and those layers times the experts a step of
    `tokens` tokens is expected to touch (uniform routing). (0, 0) for a dense model."""
    if not model.is_moe:
        return 0.0, 0.0
    active = step_load(tokens, model.num_experts, model.experts_per_token).active_experts
    return float(model.num_moe_layers), model.num_moe_layers * active
