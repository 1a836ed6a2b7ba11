"""The recorder's inter-token statistics equal a direct per-request computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.policy.sampling_params import SamplingParams
from engine.policy.sequence import Sequence
from simulator.fleet.metrics import Recorder


def _finished(request_id: int, token_times: list[float]) -> Sequence:
    seq = Sequence(request_id, [1, 2, 3], SamplingParams(max_tokens=max(len(token_times), 1)), 0.0)
    seq.token_ids.extend([0] * len(token_times))
    seq.token_times = list(token_times)
    seq.first_scheduled_time = 0.0
    seq.first_token_time = token_times[0] if token_times else None
    seq.finish_time = token_times[-1] if token_times else 0.0
    return seq


def test_itl_max_and_percentiles_match_per_request_gaps() -> None:
    rng = np.random.default_rng(0)
    recorder, expected_max, all_gaps = Recorder(), {}, []
    for request_id in range(300):
        n = int(rng.choice([1, 1, 2, 5, 40]))  # a finished request has sampled a token
        times = np.cumsum(rng.exponential(0.02, n)).tolist()
        recorder.finish(_finished(request_id, times), replica=0)
        gaps = np.diff(times)
        all_gaps.extend(gaps)
        expected_max[request_id] = gaps.max() if len(gaps) else math.nan
    frame = recorder.requests_frame().set_index("request_id")
    for request_id, value in expected_max.items():
        got = frame.loc[request_id, "itl_max_s"]
        assert (math.isnan(value) and math.isnan(got)) or got == pytest.approx(value, rel=1e-12)
    for q in (50, 90, 99):
        assert recorder.itl_percentile(q) == pytest.approx(np.percentile(all_gaps, q), rel=0.02)
    assert recorder.itl_mean() == pytest.approx(np.mean(all_gaps), rel=0.01)
