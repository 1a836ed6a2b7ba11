"""Prefill/decode disaggregation: the sanity checks a planner relies on."""

from __future__ import annotations

import pytest

from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload

TRACE = "synthetic:num=200,input=lognormal(1000,0.5),output=lognormal(100,0.5),rate={rate}"
FREE_LINK = {"kv_transfer_gbps": 1e9, "kv_transfer_latency_s": 0.0}


def run(rate: float = 6.0, num: int = 200, bulk_decodes: bool = True, **fields):
    config = SimConfig(**{"model": "llama-3.1-8b", "hardware": "h100-sxm", "engine": "servecast", **fields})
    trace = TRACE.format(rate=rate).replace("num=200", f"num={num}")
    return simulate(config, load_workload(trace), bulk_decodes=bulk_decodes).summary


def test_free_transfers_and_a_replica_per_request_reproduce_co_located_serving() -> None:
    """Every request alone on its replicas: its prefill is the co-located one's first step, its
    decode the co-located one's later steps (the first of them also computes the prompt's last
    partial block), and a transfer that costs nothing hands the first token on at once."""
    co = run(rate=2.0, replicas=200)
    split = run(rate=2.0, disaggregate="200:200", **FREE_LINK)
    assert split.ttft_s.mean == pytest.approx(co.ttft_s.mean, rel=1e-6)
    assert split.ttft_s.p99 == pytest.approx(co.ttft_s.p99, rel=1e-6)
    assert split.e2e_s.mean == pytest.approx(co.e2e_s.mean, rel=1e-3)
    assert split.tpot_s.mean == pytest.approx(co.tpot_s.mean, rel=1e-3)
    assert split.cost.usd_per_hour == 2 * co.cost.usd_per_hour and split.replicas == 400


def test_a_slower_link_never_lowers_ttft() -> None:
    ttfts, transfers = [], []
    for gbps in (50.0, 5.0, 0.5):
        s = run(disaggregate="1:2", kv_transfer_gbps=gbps)
        ttfts.append(s.ttft_s.mean)
        transfers.append(s.disaggregation.transfer.mean_s)
    assert ttfts == sorted(ttfts) and ttfts[0] < ttfts[-1]
    assert transfers == sorted(transfers) and transfers[-1] > 10 * transfers[0]


def test_more_decode_replicas_never_raise_tpot() -> None:
    tpots = [run(rate=12.0, disaggregate=f"2:{d}").tpot_s.mean for d in (1, 2, 4)]
    assert tpots == sorted(tpots, reverse=True) and tpots[-1] < tpots[0]


def test_the_pools_and_transfers_are_reported_and_bulk_decode_runs_decide_as_single_steps() -> None:
    s = run(disaggregate="1:2", prefill_tp=2)
    pools = s.disaggregation
    assert (pools.prefill.replicas, pools.prefill.tp, pools.prefill.gpus) == (1, 2, 2)
    assert (pools.decode.replicas, pools.decode.gpus) == (2, 2)
    assert s.num_finished == 200 and pools.transfer.count == 200  # every request has a second token
    assert 0 < pools.prefill.busy_fraction < 1 and 0 < pools.decode.busy_fraction < 1
    single = run(disaggregate="1:2", prefill_tp=2, bulk_decodes=False)
    assert single.ttft_s == s.ttft_s and single.e2e_s.to_dict() == pytest.approx(s.e2e_s.to_dict())


def test_one_token_requests_end_at_their_prefill_replica() -> None:
    config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", disaggregate="1:1", engine="servecast")
    s = simulate(config, load_workload("synthetic:num=20,input=500,output=1,rate=5")).summary
    assert s.num_finished == 20 and s.disaggregation.transfer.count == 0


def test_pools_on_different_accelerators_are_priced_each() -> None:
    s = run(num=40, disaggregate="1:2", prefill_hardware="h100-sxm", hardware="a100-80gb")
    pools = s.disaggregation
    assert pools.prefill.hardware == "h100-sxm" and pools.decode.hardware == "a100-80gb"
    h100, a100 = (SimConfig(model="llama-3.1-8b", hardware=h).accelerator().price_per_hour_usd
                  for h in ("h100-sxm", "a100-80gb"))
    assert s.cost.usd_per_hour == pytest.approx(h100 + 2 * a100)


@pytest.mark.parametrize("fields, message", [
    ({"disaggregate": "2-6"}, "write P:D"),
    ({"disaggregate": "0:2"}, "each at least 1"),
    ({"disaggregate": "1:2", "replicas": 3}, "leave replicas at 1"),
    ({"prefill_tp": 2}, "give disaggregate=P:D too"),
    ({"disaggregate": "1:1", "speculative": "ngram", "num_speculative_tokens": 2, "acceptance": 0.5},
     "without speculative decoding"),
    ({"disaggregate": "1:1", "kv_transfer_gbps": 0}, "greater than 0"),
])
def test_bad_disaggregation_settings_name_the_fix(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(model="llama-3.1-8b", hardware="h100-sxm", **fields)
