"""Published acceptance presets (simulator/catalog/acceptance.py): each well formed and sourced,
tau read back as the rate that gives it, and a simulation on a preset equal to one on the same
profile given as a measured file."""

from __future__ import annotations

import json

import pytest

from simulator.catalog.acceptance import presets, rate_for
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.fleet.speculation import acceptance_profile
from simulator.workload.load import load_workload


def test_every_preset_is_a_chain_with_its_source_and_a_consistent_mean() -> None:
    assert len(presets()) >= 5
    for p in presets().values():
        assert p.source and p.dataset and 1 <= p.drafts <= 8
        if p.by_position:
            assert len(p.by_position) == p.drafts and list(p.by_position) == sorted(p.by_position, reverse=True)
            # The source's own tau is 1 + the per-position rates' sum, to its rounding.
            assert 1 + sum(p.by_position) == pytest.approx(p.tau, abs=0.08)
        profile = p.by_position_or_rate()
        assert 1 + sum(profile) == pytest.approx(p.tau, abs=0.08)


def test_tau_is_read_back_as_the_rate_that_gives_it() -> None:
    for k, alpha in ((3, 0.4), (7, 0.8), (1, 0.9)):
        tau = sum(alpha ** i for i in range(k + 1))
        assert rate_for(tau, k) == pytest.approx(alpha, rel=1e-9)
    with pytest.raises(ValueError, match="impossible"):
        rate_for(5.0, 3)


def test_a_preset_simulates_as_the_same_profile_given_as_a_file(tmp_path) -> None:
    preset = presets()["vllm-eagle3-k5-minicpm3"]
    path = tmp_path / "acceptance.json"
    path.write_text(json.dumps({"acceptance_by_position": list(preset.by_position)}))
    assert acceptance_profile(gamma=5, preset=preset.id) == acceptance_profile(path=str(path), gamma=5)
    spec = "synthetic:num=40,input=uniform(50,300),output=uniform(20,120),rate=4"
    common = dict(model="llama-3.1-8b", hardware="a100-80gb", speculative="ngram", num_speculative_tokens=5)
    a = simulate(SimConfig(**common, acceptance_preset=preset.id), load_workload(spec)).summary
    b = simulate(SimConfig(**common, acceptance_file=str(path)), load_workload(spec)).summary
    assert a.tpot_s.mean == b.tpot_s.mean and a.speculation.verifications == b.speculation.verifications


def test_an_unknown_preset_or_two_acceptances_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown acceptance preset 'nope'.*vllm-mtp-k8-gsm8k"):
        SimConfig(model="llama-3.1-8b", hardware="a100-80gb", speculative="ngram", num_speculative_tokens=3,
                  acceptance_preset="nope")
    with pytest.raises(ValueError, match="one of them"):
        SimConfig(model="llama-3.1-8b", hardware="a100-80gb", speculative="ngram", num_speculative_tokens=3,
                  acceptance=0.5, acceptance_preset="vllm-mtp-k8-gsm8k")
