"""The bundled default job: a small random-weight Llama served through the engine on a real length mix."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from engine.replay import TimedRequest
from engine.policy.sampling_params import SamplingParams
from simulator.catalog.models import model_config_path
from simulator.workload.requests import BUNDLED_LENGTHS, load_length_pairs, sample_lengths

# The bundled demo model: a small Llama-architecture config (GQA, SwiGLU, RoPE) sized for a CPU, kept
# in the model catalog so the simulator can name it too (`--model servecast-demo`).
DEMO_CATALOG_ID = "servecast-demo"
DEMO_MODEL = {k: v for k, v in json.loads(model_config_path(DEMO_CATALOG_ID).read_text()).items()
              if not k.startswith("_")}


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
