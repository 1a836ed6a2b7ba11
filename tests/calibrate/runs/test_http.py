"""The trace replayer against a fake OpenAI-compatible server on loopback (real HTTP, vLLM's SSE
format, known per-token delays): what it sends, what it records, and the summary it makes."""

from __future__ import annotations

import json

import pytest

from app.common import dumps
from calibrate.runs.http import records_frame, replay, server_models
from calibrate.runs.prompts import text_prompts, token_prompts
from calibrate.runs.replay_summary import REQUESTS_FILE, SUMMARY_FILE, ReplayInfo, read_replay, summarize
from simulator.workload.load import load_workload
from tests.calibrate.runs.fake_openai import MODEL, FakeServer, serving


def info(url: str, trace: str, max_concurrency: int | None = None) -> ReplayInfo:
    return ReplayInfo(url=url, model=MODEL, trace=trace, seed=0, rate_scale=1.0, max_concurrency=max_concurrency,
                      tokenizer=None, vocab_size=256, started_at="2025-01-01T00:00:00+00:00", server=None)


def run(server: FakeServer, trace: str):
    workload = load_workload(trace)
    records = replay(server.url, MODEL, workload, token_prompts(workload, 256, 0), timeout_s=30)
    return workload, records_frame(records)


def test_every_request_is_recorded_with_the_traces_lengths_and_the_servers_delays() -> None:
    trace = "synthetic:num=12,input=uniform(20,60),output=uniform(3,8),rate=40,arrival=constant"
    with serving(FakeServer(first_token_s=0.05, token_s=0.01)) as server:
        workload, frame = run(server, trace)
    assert list(frame["request_id"]) == [r.request_id for r in workload]
    assert (frame["status"] == "finished").all() and (frame["http_status"] == 200).all()
    assert list(frame["output_tokens"]) == [r.output_tokens for r in workload]
    assert list(frame["prompt_tokens"]) == [r.prompt_tokens for r in workload]
    assert [len(t) for t in frame["token_times_s"]] == list(frame["output_tokens"])
    assert (frame["send_s"] >= frame["arrival_s"]).all()
    # Strict where the server's sleeps bound them (latency runs from arrival, before the send); the
    # client may read the first chunk late (the server shares its process), so TPOT is loose.
    assert (frame["ttft_s"] >= 0.05).all() and (frame["e2e_s"] >= 0.05 + 0.01 * (frame["output_tokens"] - 1)).all()
    assert (frame["tpot_s"] >= 0.005).all() and (frame["itl_max_s"] >= 0.01).all()
    assert frame["ttft_s"].median() < 1.0 and frame["tpot_s"].median() < 0.2
    bodies = sorted(server.received, key=lambda b: b["prompt"])
    by_prompt = sorted(zip(token_prompts(workload, 256, 0), workload), key=lambda p: p[0])
    for body, (prompt, request) in zip(bodies, by_prompt):
        assert body["prompt"] == prompt and body["model"] == MODEL and body["stream"] is True
        assert body["max_tokens"] == body["min_tokens"] == request.output_tokens and body["ignore_eos"] is True
        assert body["temperature"] == 0 and body["stream_options"] == {"include_usage": True}


def test_requests_sharing_a_system_prompt_send_equal_leading_ids_and_their_own_tails() -> None:
    trace = "synthetic:num=10,prefixes=2,prefix_len=32,input=16,output=2,rate=100"
    with serving(FakeServer(first_token_s=0.0, token_s=0.0)) as server:
        workload, frame = run(server, trace)
    assert (frame["status"] == "finished").all()
    sent = [b["prompt"] for b in server.received]
    heads = {tuple(p[:32]) for p in sent}
    assert len(heads) == 2 == len({r.segments for r in workload})
    assert len({tuple(p[32:]) for p in sent}) == 10


def test_a_refused_request_is_recorded_and_the_others_finish(tmp_path) -> None:
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("prompt_tokens,output_tokens\n10,3\n12,5\n14,4\n16,6\n")
    trace = f"{lengths},rate=50"
    with serving(FakeServer(first_token_s=0.0, token_s=0.001, reject_max_tokens=frozenset({5}))) as server:
        _, frame = run(server, trace)
    refused = frame[frame["requested_output_tokens"] == 5].iloc[0]
    assert refused["status"] == "error" and refused["http_status"] == 400
    assert refused["reason"] == "HTTP 400: max_tokens=5 is refused" and refused["output_tokens"] == 0
    rest = frame[frame["requested_output_tokens"] != 5]
    assert (rest["status"] == "finished").all() and list(rest["output_tokens"]) == [3, 4, 6]
    summary = summarize(frame, {}, info(server.url, trace))
    assert summary.num_finished == 3 and summary.num_rejected == 1
    assert summary.rejections == {"HTTP 400: max_tokens=5 is refused": 1}


def test_closed_loop_clients_send_in_order_as_one_frees_up_and_latency_runs_from_the_send() -> None:
    trace = "synthetic:num=4,input=8,output=3,concurrency=1"
    with serving(FakeServer(first_token_s=0.02, token_s=0.01)) as server:
        _, frame = run(server, trace)
    frame = frame.sort_values("send_s")
    assert list(frame["request_id"]) == [0, 1, 2, 3]  # in the trace's order
    assert (frame["arrival_s"] == frame["send_s"]).all()  # as vllm bench serve and the simulator count
    assert (frame["send_s"].iloc[1:].to_numpy() >= frame["finish_s"].iloc[:-1].to_numpy() - 1e-3).all()
    assert (frame["ttft_s"] >= 0.02).all() and (frame["ttft_s"] < 0.5).all()
    with serving(FakeServer(first_token_s=0.0, token_s=0.0)) as server:
        _, thinking = run(server, "synthetic:num=3,input=8,output=2,concurrency=1,think=0.2")
    thinking = thinking.sort_values("send_s")
    assert (thinking["send_s"].iloc[1:].to_numpy() >= thinking["finish_s"].iloc[:-1].to_numpy() + 0.2).all()


def test_two_clients_keep_two_requests_in_flight_at_most() -> None:
    with serving(FakeServer(first_token_s=0.03, token_s=0.01)) as server:
        _, frame = run(server, "synthetic:num=8,input=8,output=3,concurrency=2")
    sent, done = frame["send_s"].to_numpy(), frame["finish_s"].to_numpy()
    in_flight = [((sent <= t) & (done > t)).sum() for t in sent]
    assert max(in_flight) == 2


def test_a_server_without_usage_gets_its_chunks_counted() -> None:
    class NoUsage(FakeServer):
        async def _stream(self, body, n):
            async for line in super()._stream({**body, "stream_options": None}, n):
                yield line

    trace = "synthetic:num=3,input=9,output=4,rate=100"
    with serving(NoUsage(first_token_s=0.0, token_s=0.001)) as server:
        _, frame = run(server, trace)
    assert list(frame["output_tokens"]) == [4, 4, 4] and list(frame["prompt_tokens"]) == [9, 9, 9]


def test_the_summary_has_the_simulators_keys_and_reads_back_the_same(tmp_path) -> None:
    from simulator.fleet.run import simulate
    from simulator.fleet.sim_config import SimConfig

    trace = "synthetic:num=8,input=20,output=uniform(2,6),rate=50"
    simulated = simulate(SimConfig(model="llama-3.1-8b", hardware="h100-sxm"),
                         load_workload("synthetic:num=30,input=100,output=10,rate=5")).summary.to_dict()
    with serving(FakeServer(first_token_s=0.01, token_s=0.005)) as server:
        _, frame = run(server, trace)
        models = server_models(server.url)
    slos = {"ttft_p99": 10.0, "itl_p50": 10.0, "tpot_mean": 1e-6}
    summary = summarize(frame, slos, info(server.url, trace))
    as_json = summary.to_dict()
    assert list(as_json) == list(simulated) + ["replay"]
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert set(as_json[key]) == set(simulated[key])
    assert set(as_json["throughput"]) == set(simulated["throughput"]) and set(as_json["slo"]) == set(simulated["slo"])
    assert summary.slo.met == {"ttft_p99": True, "itl_p50": True, "tpot_mean": False}
    assert summary.queue_s is None and summary.kv_utilization is None and summary.cost is None
    assert summary.itl_s.mean >= 0.0025 and summary.replay.short_outputs == 0
    assert models["data"][0]["id"] == MODEL
    frame.to_parquet(tmp_path / REQUESTS_FILE, index=False)
    (tmp_path / SUMMARY_FILE).write_text(dumps(summary))
    back = read_replay(tmp_path)
    assert back.info == info(server.url, trace) and back.summary.to_dict() == json.loads(dumps(summary))
    assert dumps(summarize(back.requests, slos, back.info)) == dumps(summary)


def test_read_replay_names_what_is_missing(tmp_path) -> None:
    with pytest.raises(ValueError, match="not a replay folder"):
        read_replay(tmp_path)
    (tmp_path / REQUESTS_FILE).write_bytes(b"")
    (tmp_path / SUMMARY_FILE).write_text(json.dumps({"num_requests": 1}))
    with pytest.raises(ValueError, match="no replay section"):
        read_replay(tmp_path)


def test_text_prompts_encode_to_the_traces_lengths_and_share_their_system_prompts(tmp_path) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([f"the quick brown fox {i} jumps over the lazy dog" for i in range(300)],
                            vocab_size=400, min_frequency=1)
    PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    workload = load_workload("synthetic:num=12,prefixes=2,prefix_len=24,input=uniform(1,30),output=2,rate=10")
    texts = text_prompts(workload, tokenizer, len(tokenizer), seed=0)
    encoded = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    assert [len(e) for e in encoded] == [r.prompt_tokens for r in workload]
    heads = {}
    for r, ids in zip(workload, encoded):
        assert heads.setdefault(r.segments, ids[:24]) == ids[:24]
    assert len({tuple(h) for h in heads.values()}) == 2


def test_the_replay_and_the_simulators_clients_send_alike() -> None:
    """Given each request's measured service time, the simulator's gate (simulator/fleet/clients.py)
    sends each request when the replay did: the same closed loop on both sides."""
    import simpy

    from simulator.fleet.clients import ClientGate

    trace = "synthetic:num=10,input=8,output=uniform(2,12),concurrency=3,think=0.02"
    with serving(FakeServer(first_token_s=0.01, token_s=0.01)) as server:
        workload, frame = run(server, trace)
    frame = frame.set_index("request_id")
    took = (frame["finish_s"] - frame["send_s"]).to_dict()
    env = simpy.Environment()
    gate = ClientGate(env, workload.clients, workload.requests, ingress_s=0.0)
    sent = {}

    def serve(request):
        sent[request.request_id] = env.now

        def finish():
            yield env.timeout(took[request.request_id])
            gate.done(env.now)
        env.process(finish())

    env.process(gate.sends(serve))
    env.run()
    # Client-side reaction lags (a few ms a send) add up along a chain of sends.
    assert max(abs(sent[i] - frame.loc[i, "send_s"]) for i in sent) < 0.05
