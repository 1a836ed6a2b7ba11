"""Speculative decoding in the simulator: the engine's lookahead scheduling, acceptance drawn from
a rate or a measured profile, the draft's cost and memory."""

from __future__ import annotations

import json

import pytest

from simulator.run import simulate
from simulator.sim_config import SimConfig
from simulator.speculation import acceptance_profile
from simulator.synthetic import load_workload

LIGHT = "synthetic:num=24,input=200,output=128,rate=0.5"
FULL = "synthetic:num=48,input=200,output=128,rate=inf"


def run(spec: str, seed: int = 1, **knobs):
    config = SimConfig(model="llama-2-70b", hardware="h100-sxm", tp=4, **knobs)
    return simulate(config, load_workload(spec, seed=seed))


def test_every_request_gets_exactly_its_tokens_and_runs_are_deterministic() -> None:
    knobs = dict(speculative="ngram", num_speculative_tokens=4, acceptance=0.6)
    a, b = run(LIGHT, **knobs), run(LIGHT, **knobs)
    assert (a.requests["status"] == "finished").all()
    assert (a.requests["output_tokens"] == 128).all()
    assert a.requests.equals(b.requests) and a.summary["speculation"] == b.summary["speculation"]


def test_full_acceptance_emits_gamma_plus_one_tokens_per_step_and_cuts_tpot() -> None:
    plain = run(LIGHT)
    spec = run(LIGHT, speculative="ngram", num_speculative_tokens=3, acceptance=1.0)
    stats = spec.summary["speculation"]
    assert stats["acceptance_rate"] == 1.0
    assert stats["mean_accepted_per_verification"] == pytest.approx(3.0, abs=0.1)  # max_tokens trims a few
    assert spec.summary["tpot_s"]["mean"] < plain.summary["tpot_s"]["mean"] / 2.5


def test_acceptance_sets_the_gain_and_zero_acceptance_costs() -> None:
    tpot = {alpha: run(LIGHT, speculative="ngram", num_speculative_tokens=4, acceptance=alpha).summary["tpot_s"]["mean"]
            for alpha in (0.0, 0.4, 0.8)}
    plain = run(LIGHT).summary["tpot_s"]["mean"]
    assert tpot[0.8] < tpot[0.4] < plain < tpot[0.0]  # verifying drafts that all fail only adds work


def test_a_draft_model_costs_time_and_memory() -> None:
    ngram = run(FULL, speculative="ngram", num_speculative_tokens=4, acceptance=0.7)
    draft = run(FULL, speculative="draft", num_speculative_tokens=4, acceptance=0.7, draft_model="llama-2-7b")
    assert draft.summary["speculation"]["draft_time_s"] > 0 == ngram.summary["speculation"]["draft_time_s"]
    assert draft.summary["duration_s"] > ngram.summary["duration_s"]
    assert draft.memory.num_blocks < ngram.memory.num_blocks  # draft weights and its KV share the GPUs


def test_acceptance_profiles(tmp_path) -> None:
    assert acceptance_profile(0.5, gamma=3) == [0.5, 0.25, 0.125]
    measured = tmp_path / "acceptance.json"
    measured.write_text(json.dumps({"acceptance_by_position": [0.8, 0.6, 0.65]}))
    profile = acceptance_profile(path=str(measured), gamma=5)
    assert profile[:3] == [0.8, 0.6, 0.6]  # never increasing: a later draft needs the earlier ones
    assert profile[3] == pytest.approx(0.6) and all(x >= y for x, y in zip(profile, profile[1:]))
    per_slot = tmp_path / "slots.json"
    per_slot.write_text(json.dumps({"acceptance_by_position": [0.9, 0.8], "acceptance_by_slot": [0.5, 0.4]}))
    assert acceptance_profile(path=str(per_slot), gamma=2) == [0.5, 0.4]  # every slot is filled in simulation
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="acceptance file"):
        acceptance_profile(path=str(bad))


@pytest.mark.parametrize("knobs, message", [
    (dict(speculative="ngram", num_speculative_tokens=4), "needs the draft acceptance"),
    (dict(speculative="ngram", num_speculative_tokens=0, acceptance=0.5), "between 1 and 8"),
    (dict(speculative="draft", num_speculative_tokens=2, acceptance=0.5), "needs draft_model"),
    (dict(speculative="ngram", num_speculative_tokens=2, acceptance=0.5, scheduler="static"), "continuous"),
])
def test_bad_speculation_settings(knobs, message) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(model="llama-2-70b", hardware="h100-sxm", **knobs)


def test_a_draft_with_another_vocabulary_is_refused() -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", speculative="draft", num_speculative_tokens=2,
                       acceptance=0.5, draft_model="llama-2-7b")
    with pytest.raises(ValueError, match="tokenizer"):
        config.check()
