"""Speculative decoding in the simulator: the engine's lookahead scheduling, acceptance drawn from
a rate or a measured profile, the draft's cost and memory."""

from __future__ import annotations

import json

import pytest

from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.speculation import acceptance_profile, request_rates
from simulator.workload.load import load_workload

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
    assert a.requests.equals(b.requests) and a.summary.speculation == b.summary.speculation


def test_full_acceptance_emits_gamma_plus_one_tokens_per_step_and_cuts_tpot() -> None:
    plain = run(LIGHT)
    spec = run(LIGHT, speculative="ngram", num_speculative_tokens=3, acceptance=1.0)
    stats = spec.summary.speculation
    assert stats.acceptance_rate == 1.0
    assert stats.mean_accepted_per_verification == pytest.approx(3.0, abs=0.1)  # max_tokens trims a few
    assert spec.summary.tpot_s.mean < plain.summary.tpot_s.mean / 2.5


def test_acceptance_sets_the_gain_and_zero_acceptance_costs() -> None:
    tpot = {alpha: run(LIGHT, speculative="ngram", num_speculative_tokens=4, acceptance=alpha).summary.tpot_s.mean
            for alpha in (0.0, 0.4, 0.8)}
    plain = run(LIGHT).summary.tpot_s.mean
    assert tpot[0.8] < tpot[0.4] < plain < tpot[0.0]  # verifying drafts that all fail only adds work


def test_a_draft_model_costs_time_and_memory() -> None:
    ngram = run(FULL, speculative="ngram", num_speculative_tokens=4, acceptance=0.7)
    draft = run(FULL, speculative="draft", num_speculative_tokens=4, acceptance=0.7, draft_model="llama-2-7b")
    assert draft.summary.speculation.draft_time_s > 0 == ngram.summary.speculation.draft_time_s
    assert draft.summary.duration_s > ngram.summary.duration_s
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


def test_request_rates_invert_the_share_of_drafts_accepted(tmp_path) -> None:
    # A request with per-token rate 0.5 at gamma 4 accepts (0.5 + 0.25 + 0.125 + 0.0625) / 4 of its drafts.
    share = (0.5 + 0.25 + 0.125 + 0.0625) / 4
    path = tmp_path / "acceptance.json"
    path.write_text(json.dumps({"acceptance_by_position": [0.6, 0.4, 0.3, 0.2],
                                "request_acceptance": [[400, round(400 * share)], [40, 40], [40, 0]]}))
    rates = request_rates(str(path))
    assert rates[0] == pytest.approx(0.5, abs=1e-3) and rates[1] == pytest.approx(1.0) and rates[2] == pytest.approx(0.0)
    assert request_rates(None) == ()
    path.write_text(json.dumps({"acceptance_by_position": [0.6], "request_acceptance": [[4, 5]]}))
    with pytest.raises(ValueError, match="more drafts than it was proposed"):
        request_rates(str(path))


def test_requests_that_differ_in_acceptance_finish_a_batch_later_than_pooled_rates_say(tmp_path) -> None:
    # Half the requests accept every draft and half none: the pooled profile (every request at the
    # mean) finishes the batch sooner than the mixture, whose slow half needs a step per token.
    pooled = tmp_path / "pooled.json"
    pooled.write_text(json.dumps({"acceptance_by_position": [0.5, 0.5, 0.5]}))
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({"acceptance_by_position": [0.5, 0.5, 0.5],
                                 "request_acceptance": [[90, 90], [90, 0]]}))
    knobs = dict(speculative="ngram", num_speculative_tokens=3)
    a = run(FULL, acceptance_file=str(pooled), **knobs)
    b = run(FULL, acceptance_file=str(mixed), **knobs)
    assert (b.requests["output_tokens"] == 128).all()
    assert b.summary.duration_s > a.summary.duration_s
    # The mixture's TPOTs split in two: requests at rate 1 take a step per 4 tokens, at rate 0 one per token.
    tpot = b.requests["tpot_s"].sort_values().to_numpy()
    assert tpot[-1] > 2.5 * tpot[0]


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
