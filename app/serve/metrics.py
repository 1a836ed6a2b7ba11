"""/metrics: Prometheus text under vLLM's metric names (model_name label), so dashboards and
scrapers written for vLLM read servecast's server unchanged. Updated on the thread reading the
engine's outputs (prometheus_client is thread-safe); the gauges are set from the engine's last
LoadState on scrape."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from app.serve.engine_loop import LoadState

if TYPE_CHECKING:
    from engine.outputs import RequestOutput

disable_created_metrics()  # no *_created series (vLLM's exposition has none either)

# Buckets from a millisecond to minutes (TTFT, E2E) and 10 ms to 80 s (ITL), spanning a CPU's and a GPU's latencies.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = registry = CollectorRegistry()
        label = {"labelnames": ("model_name",), "registry": registry}

        def gauge(name: str, doc: str):
            return Gauge(name, doc, **label).labels(model_name)

        self.running = gauge("vllm:num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.")
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", buckets=TTFT_BUCKETS,
                              **label).labels(model_name)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between output tokens.",
                             buckets=ITL_BUCKETS, **label).labels(model_name)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Request latency, arrival to finish.",
                             buckets=E2E_BUCKETS, **label).labels(model_name)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.",
                                     **label).labels(model_name)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", **label).labels(model_name)
        self.prefix_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                      **label).labels(model_name)
        self.prefix_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                   **label).labels(model_name)
        self.success = Counter("vllm:request_success", "Finished requests by finish reason.",
                               labelnames=("model_name", "finished_reason"), registry=registry)
        self.model_name = model_name
        self._seen_tokens: dict[str, int] = {}

    def on_output(self, out: "RequestOutput") -> None:
        """Called with every engine output: counts new tokens and their gaps, and a finish."""
        seen = self._seen_tokens.get(out.request_id, 0)
        times = out.token_times
        for i in range(max(seen, 1), len(times)):
            self.itl.observe(times[i] - times[i - 1])
        if seen == 0 and times and out.ttft_s is not None:
            self.ttft.observe(out.ttft_s)
        self.generation_tokens.inc(len(times) - seen)
        self._seen_tokens[out.request_id] = len(times)
        if out.finished:
            del self._seen_tokens[out.request_id]
            self.on_finish(out)

    def on_finish(self, out: "RequestOutput") -> None:
        self.success.labels(self.model_name, out.finish_reason or "abort").inc()
        if out.e2e_s is not None:
            self.e2e.observe(out.e2e_s)
        prompt = len(out.prompt_token_ids)
        self.prompt_tokens.inc(prompt)
        self.prefix_queries.inc(prompt)
        self.prefix_hits.inc(out.num_cached_prompt_tokens)

    def exposition(self, state: LoadState) -> bytes:
        self.running.set(state.running)
        self.waiting.set(state.waiting)
        self.kv_usage.set(state.kv_usage)
        return generate_latest(self.registry)
