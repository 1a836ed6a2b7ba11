"""Trace loaders and synthetic workloads: good files load, bad rows are reported by line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from simulator.workload.load import load_workload
from simulator.workload.requests import SEGMENT_BASE, WorkloadError

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "traces"


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_azure_csv(tmp_path) -> None:
    f = write(tmp_path / "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                      "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    w = load_workload(f)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in w] == [
        (0.0, 374, 44), (pytest.approx(4.314579, abs=1e-6), 396, 109)]


def test_vidur_csv_with_window_limit_and_rate_scale(tmp_path) -> None:
    rows = "".join(f"{i * 0.5},{100 + i},{10 + i}\n" for i in range(20))
    f = write(tmp_path / "vidur.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n" + rows)
    w = load_workload(f + ",window=2-6,limit=5", rate_scale=2.0)
    assert len(w) == 5 and w.requests[0].prompt_tokens == 104
    assert [r.arrival_s for r in w] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
    assert [r.request_id for r in w] == list(range(5))


def test_mooncake_jsonl_shares_prefix_tokens_exactly_where_hash_ids_agree(tmp_path) -> None:
    lines = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
             {"timestamp": 1500, "input_length": 700, "output_length": 3, "hash_ids": [7, 11]}]
    f = write(tmp_path / "mc.jsonl", "\n".join(json.dumps(x) for x in lines) + "\n")
    a, b = load_workload(f).requests
    assert b.arrival_s == 1.5 and a.segment_tokens == 512
    ta, tb = a.prompt_token_ids(), b.prompt_token_ids()
    assert len(ta) == 1100 and len(tb) == 700
    assert ta[:512] == tb[:512] and ta[512] != tb[512]
    assert ta[0] == SEGMENT_BASE + 7


def test_length_only_files_need_an_arrival_process(tmp_path) -> None:
    f = write(tmp_path / "lengths.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
                                        + "".join(f"{10 + i},{5 + i},0,0\n" for i in range(50)))
    with pytest.raises(WorkloadError, match="rate="):
        load_workload(f)
    w = load_workload(f + ",rate=10,arrival=constant,num=20")
    assert len(w) == 20 and w.requests[1].arrival_s == pytest.approx(0.1)


@pytest.mark.parametrize("text, message", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\nyesterday,1,1\n",
     r"azure\.csv:3: TIMESTAMP"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,-4\n", r"azure\.csv:2: GeneratedTokens"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,3.5,4\n", r"azure\.csv:2: ContextTokens"),
    ("when,prompt\n1,2\n", "unknown CSV trace columns"),
])
def test_bad_csv_rows_are_reported_by_line(tmp_path, text, message) -> None:
    with pytest.raises(WorkloadError, match=message):
        load_workload(write(tmp_path / "azure.csv", text))


def test_bad_mooncake_lines_are_reported_and_can_be_skipped(tmp_path) -> None:
    good = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]})
    bad = ["{not json", json.dumps({"timestamp": 1, "input_length": 10}),
           json.dumps({"timestamp": 2, "input_length": 10, "output_length": 2, "hash_ids": [1, 2, 3]})]
    f = write(tmp_path / "mc.jsonl", "\n".join([good, *bad, good]) + "\n")
    with pytest.raises(WorkloadError, match=r"3 bad row\(s\).*mc\.jsonl:2: not valid JSON.*mc\.jsonl:3: missing "
                                            r"output_length.*mc\.jsonl:4: 3 hash_ids"):
        load_workload(f)
    w = load_workload(f + ",skip_bad=1")
    assert len(w) == 2 and len(w.skipped) == 3 and w.skipped[0].startswith("mc.jsonl:2")


@pytest.mark.parametrize("spec, message", [
    ("synthetic:num=0", "whole number"), ("synthetic:input=uniform(9,3)", "uniform"), ("synthetic:rate=-1", "rate"),
    ("synthetic:arrival=weibull,rate=2", "arrival process"), ("synthetic:users=3", "prefixes"),
    ("synthetic:bogus=1", "unknown option"), ("synthetic:num", "key=value"), ("nothere.csv", "no trace file"),
    ("", "empty trace spec")])
def test_bad_synthetic_specs_name_the_problem(spec, message) -> None:
    with pytest.raises(WorkloadError, match=message):
        load_workload(spec)


def test_synthetic_arrivals_and_lengths() -> None:
    burst = load_workload("synthetic:num=4000,input=100,output=10,rate=10,arrival=gamma,cv=3", seed=1)
    poisson = load_workload("synthetic:num=4000,input=100,output=10,rate=10", seed=1)
    gaps = lambda w: np.diff([r.arrival_s for r in w])  # noqa: E731
    assert poisson.rate_per_s == pytest.approx(10, rel=0.1) and burst.rate_per_s == pytest.approx(10, rel=0.2)
    assert np.std(gaps(burst)) / np.mean(gaps(burst)) == pytest.approx(3, rel=0.15)
    assert np.std(gaps(poisson)) / np.mean(gaps(poisson)) == pytest.approx(1, rel=0.1)
    at_once = load_workload("synthetic:num=10,input=uniform(5,9),output=lognormal(50,0.5),rate=inf")
    assert math.isinf(at_once.rate_per_s) and all(5 <= r.prompt_tokens <= 9 for r in at_once)


def test_shared_prefix_users_send_fixed_prompts_in_a_cycle() -> None:
    """users=M: N x M fixed prompts (inference-perf's shared_prefix data), each a system prompt
    then its user's question, sent in a shuffled cycle: request i and i + N*M are the same prompt."""
    w = load_workload("synthetic:prefixes=3,prefix_len=64,users=5,input=uniform(10,100),output=4,rate=inf,num=45")
    assert len(w) == 45 and len({r.segments for r in w}) == 15
    prompts = [r.prompt_token_ids() for r in w]
    for i in range(30):
        assert prompts[i] == prompts[i + 15] and w.requests[i].prompt_tokens == w.requests[i + 15].prompt_tokens
    assert len({tuple(p) for p in prompts[:15]}) == 15
    by_system = {}
    for r, p in zip(w, prompts):
        by_system.setdefault(r.segments[0], set()).add(tuple(p))
    assert sorted(by_system) == [0, 1, 2] and all(len(v) == 5 for v in by_system.values())
    for r, p in zip(w, prompts):  # the system prompt's 64 tokens are its own, shared by its users
        assert p[:64] == [q for q in prompts if w.requests[prompts.index(q)].segments[0] == r.segments[0]][0][:64]
    assert all(r.shared_prompt_tokens == r.prompt_tokens for r in w)  # all of it can hit the cache


def test_shared_prefix_without_users_shares_only_the_system_prompt() -> None:
    w = load_workload("synthetic:prefixes=3,prefix_len=64,input=10,output=4,rate=inf,num=30")
    assert {r.segments for r in w} <= {(0,), (1,), (2,)} and all(r.prompt_tokens == 74 for r in w)
    assert len({tuple(r.prompt_token_ids()) for r in w}) == 30


def test_stages_run_back_to_back_at_their_rates() -> None:
    w = load_workload("synthetic:prefixes=9,users=5,prefix_len=100,input=473,output=248,arrival=constant,"
                      "stages=8x60+20x30")
    arrivals = np.array([r.arrival_s for r in w])
    assert len(w) == 8 * 60 + 20 * 30 and arrivals[0] == 0.0
    assert np.allclose(np.diff(arrivals[:480]), 1 / 8) and np.allclose(np.diff(arrivals[480:]), 1 / 20)
    assert arrivals[480] == pytest.approx(60.0) and all(r.prompt_tokens == 573 for r in w)
    poisson = load_workload("synthetic:input=10,output=5,stages=10x200+40x100", seed=3)
    times = np.array([r.arrival_s for r in poisson])
    assert (times < 200).sum() == pytest.approx(2000, rel=0.1) and (times >= 200).sum() == pytest.approx(4000, rel=0.1)


@pytest.mark.parametrize("spec, message", [
    ("synthetic:input=10,output=5,stages=8x600+x", "RATExSECONDS"),
    ("synthetic:input=10,output=5,stages=8x600,rate=3", "drop rate"),
    ("synthetic:input=10,output=5,stages=0x600", "RATExSECONDS"),
])
def test_bad_stages_name_the_fix(spec, message) -> None:
    with pytest.raises(WorkloadError, match=message):
        load_workload(spec)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/traces is not beside the checkout")
def test_real_shared_traces_load() -> None:
    conv = load_workload(str(SHARED / "splitwise_conv.csv"))
    azure = load_workload(str(SHARED / "AzureLLMInferenceTrace_conv.csv"))
    assert len(conv) == len(azure) == 19366
    assert [r.prompt_tokens for r in conv.requests[:50]] == [r.prompt_tokens for r in azure.requests[:50]]
    mooncake = load_workload(str(SHARED / "conversation_trace.jsonl"))
    assert len(mooncake) == 12031 and mooncake.requests[0].segment_tokens == 512


def test_skipped_rows_of_a_length_only_file_are_listed(tmp_path) -> None:
    f = write(tmp_path / "lengths.csv", "num_prefill_tokens,num_decode_tokens\n10,5\nx,5\n12,6\n")
    with pytest.raises(WorkloadError, match=r"lengths\.csv:3"):
        load_workload(f + ",rate=5")
    w = load_workload(f + ",rate=5,skip_bad=1")
    assert len(w) == 2 and w.skipped == ["lengths.csv:3: num_prefill_tokens must be a whole number, got 'x'"]


def test_a_portable_spec_names_its_files_absolutely(tmp_path, monkeypatch) -> None:
    from simulator.workload.load import portable_spec

    (tmp_path / "t.csv").write_text("prompt_tokens,output_tokens\n10,5\n20,6\n")
    monkeypatch.chdir(tmp_path)
    assert portable_spec("t.csv,rate=2,num=4") == f"{tmp_path / 't.csv'},rate=2,num=4"
    spec = portable_spec("synthetic:num=4,lengths=t.csv,arrival=gamma,cv=2,rate=1")
    assert spec == f"synthetic:num=4,lengths={tmp_path / 't.csv'},arrival=gamma,cv=2,rate=1"
    assert portable_spec("missing.csv,rate=2") == "missing.csv,rate=2"  # left for load_workload to refuse
    monkeypatch.chdir("/")
    assert len(load_workload(spec)) == 4


def test_closed_loop_specs_and_their_errors() -> None:
    from simulator.workload.requests import Clients

    workload = load_workload("synthetic:num=20,input=64,output=8,concurrency=4,think=0.5")
    assert workload.clients == Clients(4, 0.5)
    assert (np.array([r.arrival_s for r in workload]) == 0).all()  # without a rate: all may go at once
    assert workload.limited(5).clients == Clients(4, 0.5)  # transforms keep the clients
    assert load_workload("synthetic:num=20,rate=4,concurrency=2").rate_per_s < 10  # a rate still spaces them
    lengths = load_workload("traces/sharegpt_lengths.csv,num=30,concurrency=8")
    assert lengths.clients == Clients(8) and len(lengths) == 30
    assert Clients(4).scaled(2.6) == Clients(10)
    for bad, words in [("synthetic:num=5,think=1", "add concurrency"), ("synthetic:num=5,concurrency=0", ">= 1"),
                       ("synthetic:num=5,concurrency=2,think=-1", "think"),
                       ("synthetic:num=5,concurrency=2.5", "whole number")]:
        with pytest.raises(WorkloadError, match=words):
            load_workload(bad)
