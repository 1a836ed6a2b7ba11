"""The tiered pool: a host KV tier keeps evicted prefix blocks and loads them back, an arrived prompt
needs no prefill (pure Python); and simulations with a tier are what a planner can rely on."""

from __future__ import annotations

import pytest

from engine.policy.sampling_params import SamplingParams
from simulator.fleet.block_pool import KeyedSequence
from simulator.fleet.tiered_pool import ARRIVED_BLOCK, HOST_BLOCK, TieredBlockPool
from simulator.fleet.run import simulate
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload
from tests.engine.policy.block_helpers import admit


def keyed(rid: str, keys: list[int], extra_tokens: int = 1) -> KeyedSequence:
    """A sequence of len(keys) full blocks of 4 tokens (those keys) and a few tokens more."""
    s = KeyedSequence(rid, [1] * (4 * len(keys) + extra_tokens), SamplingParams(max_tokens=4), 0.0)
    s.block_hashes = list(keys) + [10_000 + hash(rid) % 10_000]  # the partial block's own key
    return s


def test_evicted_prefix_blocks_load_back_from_the_host_tier() -> None:
    pool = TieredBlockPool(num_blocks=8, block_size=4, host_blocks=3, load_s_per_block=0.5)
    first = keyed("a", [1, 2, 3])
    admit(pool, first)
    pool.free(first, finished=True)  # its 3 full blocks stay findable on the GPU, free
    filler = keyed("b", [7, 8, 9, 11, 12, 13, 14, 15], extra_tokens=0)  # takes every block: evicts a's
    admit(pool, filler)
    assert pool.offloaded_blocks == 3 and pool.num_host_blocks == 3
    pool.free(filler, finished=True)
    again = keyed("c", [1, 2, 3])
    assert pool.get_computed_blocks(again) == []  # outside schedule(): the GPU alone
    pool.loading = True
    found = pool.get_computed_blocks(again)
    assert found == [HOST_BLOCK] * 3
    assert pool.free_blocks_needed(again, 1, found) == 4  # the loaded blocks need GPU blocks too
    assert pool.allocate_slots(again, 1, found)
    assert pool.loaded_blocks == 3 and pool.take_load_s() == 1.5 and pool.take_load_s() == 0.0
    assert len(again.block_table) == 4 and again.num_registered_blocks == 3
    pool.check_invariants()
    # Registered under their keys again: the next request finds them on the GPU.
    again.num_computed_tokens = again.num_tokens
    pool.free(again, finished=True)
    assert len(pool.get_computed_blocks(keyed("d", [1, 2, 3]))) == 3 and pool.take_load_s() == 0.0


def test_the_tier_drops_its_least_recently_used_blocks() -> None:
    pool = TieredBlockPool(num_blocks=4, block_size=4, host_blocks=2, load_s_per_block=1.0)
    for rid, keys in (("a", [1, 2]), ("b", [3, 4]), ("c", [5, 6]), ("d", [7, 8])):  # c evicts a's, d b's
        s = keyed(rid, keys, extra_tokens=0)
        admit(pool, s)
        pool.free(s, finished=True)
    pool.loading = True
    assert pool.num_host_blocks == 2 and pool.offloaded_blocks == 4
    assert pool.get_computed_blocks(keyed("x", [1, 2])) == []  # a's: dropped
    assert pool.get_computed_blocks(keyed("y", [3, 4])) == [HOST_BLOCK] * 2
    with pytest.raises(ValueError, match="0 or more blocks"):
        TieredBlockPool(num_blocks=4, block_size=4, host_blocks=-1, load_s_per_block=1.0)


def test_an_arrived_prompt_is_counted_computed_without_a_load() -> None:
    pool = TieredBlockPool(num_blocks=8, block_size=4)  # no tier
    s = keyed("a", [1, 2, 3])
    s.arrived_blocks = 3
    assert pool.get_computed_blocks(s) == []
    pool.loading = True
    found = pool.get_computed_blocks(s)
    assert found == [ARRIVED_BLOCK] * 3 and pool.free_blocks_needed(s, 1, found) == 4
    assert pool.allocate_slots(s, 1, found) and pool.take_load_s() == 0.0 and pool.loaded_blocks == 0
    assert len(s.block_table) == 4 and s.num_registered_blocks == 3
    pool.check_invariants()


def conversation(num: int = 300, rate: float = 6.0) -> str:
    """Multi-turn-like traffic: 40 users, each sending one long fixed prompt again and again."""
    return (f"synthetic:prefixes=40,users=1,prefix_len=1500,input=100,output=40,num={num},rate={rate},"
            "arrival=poisson")


def run(blocks: int, offload_gb: float = 0.0, hardware_file: str | None = None, **extra):
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", num_gpu_blocks=blocks, max_num_seqs=32,
                       max_num_batched_tokens=4096, kv_offload_gb=offload_gb, hardware_file=hardware_file)
    return simulate(config, load_workload(conversation()), **extra).summary


def test_a_tier_that_is_never_needed_changes_nothing() -> None:
    roomy = run(8000)  # every prompt stays on the GPU
    with_tier = run(8000, offload_gb=100)
    assert with_tier.kv_offload.offloaded_blocks == 0 and with_tier.kv_offload.loaded_blocks == 0
    assert with_tier.ttft_s == roomy.ttft_s and with_tier.e2e_s == roomy.e2e_s
    assert roomy.kv_offload is None


def test_a_tier_serves_prefixes_the_gpu_evicted_and_a_slower_link_costs_more(tmp_path) -> None:
    small = run(700)  # room for a few of the 40 prompts: most are evicted before their user returns
    tier = run(700, offload_gb=100)
    assert tier.kv_offload.loaded_blocks > 0 and tier.kv_offload.load_s > 0
    assert tier.prefix_cache_hit_rate > small.prefix_cache_hit_rate + 0.2
    assert tier.ttft_s.mean < small.ttft_s.mean
    # The same on a slower host link: the same hits, more time loading them, never a lower TTFT.
    slow = tmp_path / "slow.yaml"
    slow.write_text("a100-80gb:\n  name: A100 on a slow host link\n  vendor: nvidia\n  memory_gb: 80\n"
                    "  memory_bandwidth_gbps: 2039\n  peak_tflops: {bf16: 312, fp16: 312, int8: 624, fp32: 19.5}\n"
                    "  interconnect_gbps: 600\n  link: nvlink\n  host_link_gbps: 2\n")
    slower = run(700, offload_gb=100, hardware_file=str(slow))
    assert slower.kv_offload.load_s > 10 * tier.kv_offload.load_s
    assert slower.ttft_s.mean >= tier.ttft_s.mean


def test_bulk_decode_runs_decide_as_single_steps_with_a_tier() -> None:
    bulk, single = run(700, offload_gb=100), run(700, offload_gb=100, bulk_decodes=False)
    assert bulk.kv_offload == single.kv_offload
    assert bulk.ttft_s.to_dict() == pytest.approx(single.ttft_s.to_dict())
    assert bulk.e2e_s.to_dict() == pytest.approx(single.e2e_s.to_dict())


@pytest.mark.parametrize("fields, message", [
    ({"enable_prefix_caching": False}, "needs enable_prefix_caching"),
    ({"scheduler": "static"}, "continuous-batching scheduler"),
    ({"kv_offload_gb": -1}, "greater than or equal"),
])
def test_bad_tier_settings_name_the_fix(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(model="llama-3.1-8b", hardware="a100-80gb", **{"kv_offload_gb": 10, **fields})


def test_a_device_without_a_host_link_or_room_for_a_block_is_refused() -> None:
    with pytest.raises(ValueError, match="set host_link_gbps"):
        SimConfig(model="llama-3.1-8b", hardware="tpu-v5e", kv_offload_gb=10).check()
    config = SimConfig(model="llama-3.1-8b", hardware="a100-80gb", num_gpu_blocks=700, kv_offload_gb=0.001)
    with pytest.raises(ValueError, match="holds no"):
        simulate(config, load_workload(conversation(num=5)))
