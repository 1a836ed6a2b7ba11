"""What a validation run is set up to do (`servecast validate`, calibrate/validation/fidelity.py): the model,
the requests and the engine's settings (ValidationSetup), the load levels, and the workload of a
level's requests at a rate (workload_at).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from calibrate.runs.deployment import deployment_config, engine_deployment
from simulator.cost.profile_format import Profile
from simulator.fleet.sim_config import SimConfig
from simulator.workload.requests import LengthPair, Workload, load_length_pairs, make_workload, sample_lengths
from simulator.workload.synthetic import arrival_times

LEVELS = {"light": 0.3, "near saturation": 0.9, "overloaded": 1.5}


@dataclass
class ValidationSetup:
    model: dict | str  # an HF config dict, or a config.json path
    num_requests: int = 120
    length_scale: float = 1 / 8
    max_total_tokens: int = 512
    lengths_file: str | None = None
    block_size: int = 16
    num_blocks: int = 512
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 256
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    # CPU threads for torch in both the profile and the engine. One by default: on small shared
    # machines two-thread kernels swing between speeds several times apart from run to run, which
    # would measure the machine's neighbours instead of the simulator.
    threads: int | None = 1
    # Engine steps of this many other requests calibrate the framework terms before each level
    # (0: the profile's forward points only).
    calibration_requests: int = 192
    # Independent measurements of each level (calibration, replay, simulation); errors are their median.
    repeats: int = 3
    # Time a small fixed piece of work before every engine step and simulate each level at the
    # machine speed it shows (calibrate/validation/speed_probe.py); off: at the calibration's average speed.
    speed_probe: bool = True
    levels: dict[str, float] = field(default_factory=lambda: dict(LEVELS))

    def engine_config(self):
        from engine import EngineConfig

        return EngineConfig(block_size=self.block_size, num_blocks=self.num_blocks, max_num_seqs=self.max_num_seqs,
                            max_num_batched_tokens=self.max_num_batched_tokens,
                            max_model_len=self.max_total_tokens, enable_prefix_caching=self.enable_prefix_caching,
                            enable_chunked_prefill=self.enable_chunked_prefill, device=self.device, dtype=self.dtype,
                            seed=self.seed)

    def check(self) -> None:
        """Raise ValueError naming the setting and the fix, before anything is profiled or served."""
        from engine.policy.config import CacheConfig, ModelConfig

        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be at least 1 (or unset for torch's choice), got {self.threads}")
        if self.calibration_requests < 0:
            raise ValueError(f"calibration requests must be 0 or more, got {self.calibration_requests}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {self.repeats}")
        if not self.length_scale > 0:
            raise ValueError(f"length scale must be positive, got {self.length_scale}")
        CacheConfig(self.block_size, self.num_blocks)
        model = ModelConfig.from_hf(self.model)
        self.engine_config().scheduler_config(model)  # max_model_len against the model, budget vs length
        self.lengths()  # the lengths file is readable and valid

    def config_path(self, folder: Path) -> str:
        if isinstance(self.model, str):
            return self.model
        path = folder / "validation-model-config.json"
        path.write_text(json.dumps(self.model, indent=2))
        return str(path)

    def sim_config(self, folder: Path, profile: str) -> SimConfig:
        # The profile says which catalog device it measured (a GPU profiled as h200, say).
        hardware = Profile.load(profile).hardware
        fields = engine_deployment(self.config_path(folder), self.engine_config(), self.num_blocks,
                                   self.max_total_tokens, hardware)
        return deployment_config(fields, "validation", profile=profile, seed=self.seed)

    def lengths(self, num: int | None = None, seed: int | None = None) -> list[LengthPair]:
        """num (default num_requests) request lengths drawn with seed (default the setup's)."""
        pairs = load_length_pairs(self.lengths_file) if self.lengths_file else load_length_pairs()
        return sample_lengths(pairs, num or self.num_requests, self.seed if seed is None else seed,
                              self.length_scale, self.max_total_tokens)


def workload_at(lengths: list[LengthPair], rate: float, seed: int, name: str) -> Workload:
    arrivals = arrival_times(len(lengths), rate, "poisson", 1.0, np.random.default_rng(seed))
    return make_workload(name, [(float(a), p.prompt_tokens, p.output_tokens, ()) for a, p in zip(arrivals, lengths)])
