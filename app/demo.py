"""The bundled default job: a small random-weight Llama served through the engine on a real length mix."""

from __future__ import annotations

import random
from dataclasses import dataclass

from engine.replay import TimedRequest
from engine.sampling_params import SamplingParams
from simulator.workload.requests import BUNDLED_LENGTHS, load_length_pairs, sample_lengths

# A small Llama-architecture config (GQA, SwiGLU, RoPE) sized for a CPU demo.
DEMO_MODEL = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 8192,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}


@dataclass(frozen=True)
class DemoWorkload:
    num_requests: int = 32
    rate_per_s: float = 8.0  # Poisson arrivals; inf = all at time 0
    length_scale: float = 1 / 8  # ShareGPT lengths shrunk to fit a CPU and the demo model
    max_total_tokens: int = 512
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests <= 0:
            raise ValueError(f"num_requests must be positive, got {self.num_requests}")
        if self.rate_per_s <= 0:
            raise ValueError(f"rate must be positive requests/s (or inf), got {self.rate_per_s}")
        if self.length_scale <= 0:
            raise ValueError(f"length scale must be positive, got {self.length_scale}")


def demo_requests(workload: DemoWorkload, vocab_size: int, lengths_path=BUNDLED_LENGTHS) -> list[TimedRequest]:
    rng = random.Random(workload.seed)
    pairs = sample_lengths(load_length_pairs(lengths_path), workload.num_requests, workload.seed,
                           workload.length_scale, workload.max_total_tokens)
    requests, t = [], 0.0
    for i, pair in enumerate(pairs):
        if workload.rate_per_s != float("inf"):
            t += rng.expovariate(workload.rate_per_s)
        prompt = [rng.randrange(vocab_size) for _ in range(pair.prompt_tokens)]
        params = SamplingParams(max_tokens=pair.output_tokens, temperature=0.0, ignore_eos=True)
        requests.append(TimedRequest(f"req-{i}", t, prompt, params))
    return requests
