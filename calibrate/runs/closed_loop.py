"""Public closed-loop vLLM results: `vllm bench serve --max-concurrency C` (or InferenceX's client,
the same semantics) on H100/H200/MI300X, each a measured run (calibrate/runs/measured.py MeasuredRun)
replayed as `synthetic:...,concurrency=C` with the run's server flags. No torch.

They are the only runs at small decode batches (1-16 requests): the vLLM campaign
(reference/vllm-runs.md) runs dozens at once, where a GEMM's smallest time (its floor) hides
behind its weight reads. Those fitted on (`fits`: an H100 SXM under a release the default profile
spans) pin that floor; the others are only ever predicted.

Sources (lengths, flags and figures as published; `ratio` is the random range ratio: each length is
uniform in [ratio x L, L]):
- IX828: SemiAnalysis InferenceX issue #828 (2026-03-01), gpt-oss-120b MXFP4 (Marlin) on H100 SXM,
  vllm/vllm-openai:v0.15.1, --max-num-seqs=C, --max-num-batched-tokens 8192, --max-model-len 10240,
  no prefix caching, 10 x C prompts, ratio 0.8. Mean TPOT only. Its 1k/8k C=64 row (16.0 ms) is
  flagged there as anomalous (likely KV-limited): never fitted.
- FP8KV: vLLM blog "FP8 KV cache" (vllm-project.github.io, _posts/2026-04-22-fp8-kvcache.md),
  v0.19.1 on one H100, about 20k in / 2k out (+-15 %), C=8, 150 prompts; median TTFT and median ITL
  (read here as median TPOT).
- PR23151: vLLM PR #23151 (2025-08, ~v0.10.1), Qwen3-30B-A3B BF16 on one H100, 2048/1024, C=10,
  100 prompts without --ignore-eos (mean output about 1016), the stock fused-MoE configuration.
- EMMY: cloudrift-ai/emmy, experiments/Qwen3-30B-A3B-Instruct-2507/serving (vLLM 0.17.0, one H200,
  --max-num-batched-tokens 4096), 4096/4096 at C=1, 8 prompts; the mean of its three seeds.
- PR25398: vLLM PR #25398 (2025-09), Qwen3-30B-A3B-FP8 on two H100 PCIe, TP2 with expert
  parallelism, 7500/7500, C=64, 128 prompts; mean TPOT of the "before" run.
- IX1061 / IX1092: SemiAnalysis InferenceX PRs #1061 (2026-04-17) and #1092 (2026-04-20),
  gpt-oss-120b MXFP4 on MI300X, vllm/vllm-openai-rocm:v0.17.0 with its AITER kernels
  (benchmarks/single_node/gptoss_fp4_mi300x.sh: --gpu-memory-utilization 0.95, --max-model-len
  2248, --block-size 64, no prefix caching, max-num-seqs and max-num-batched-tokens left at their
  defaults), ratio 0.8, --ignore-eos. #1061: TP1, 1k/1k, C = 64 / 96 / 128 / 256, 10 x C prompts,
  median TPOT. #1092: TP8, 1k/1k, C=1, 64 prompts, mean ITL (at one client, the TPOT) and a TTFT
  of unnamed statistic (taken as the mean).
Releases the catalog's profiles do not span (0.10, 0.11) run under the default profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.catalog.engines import DEFAULT_GPU_ENGINE, load_engine
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload
from simulator.workload.requests import Workload

# The device the default profile's fitted speeds are its own on (closed-loop runs elsewhere are
# predicted, never fitted).
FIT_DEVICE = "h100-sxm"


@dataclass(frozen=True)
class ClosedLoopRun:
    source: str
    release: str  # vLLM release the run used ("" where unknown)
    hardware: str
    model: str
    tp: int
    quant: str
    isl: int
    osl: int
    concurrency: int
    prompts: int
    tpot_stat: str  # the source's TPOT statistic: "mean" or "p50"
    tpot_ms: float
    ttft: tuple[str, float] | None = None  # (statistic, ms)
    ratio: float = 1.0
    kv_dtype: str = "auto"
    settings: dict = field(default_factory=dict)  # the run's server flags, as SimConfig fields
    note: str = ""
    anomalous: bool = False  # flagged by its source: predicted, never fitted

    # -- what a measured run offers the fit (calibrate/runs/measured.py MeasuredRun) ----------------
    @property
    def id(self) -> str:
        return f"{self.source}-{self.model}-tp{self.tp}-{self.quant}-{self.kv_dtype}-{self.isl}/{self.osl}-c{self.concurrency}"

    @property
    def measured(self) -> dict[str, float]:
        """The fit's TPOT only: the source's statistic of it (figures() predicts the same one)."""
        return {"tpot": self.tpot_ms}

    @property
    def family(self) -> str:
        return self.model

    @property
    def saturated(self) -> bool:
        return False

    @property
    def duration_s(self) -> float:
        """Roughly: waves of C requests, each OSL steps of about 10 ms."""
        return self.prompts / self.concurrency * self.osl * 0.01

    @property
    def engine(self) -> str | None:
        """The catalog profile spanning the run's release; None (the default) where none does."""
        try:
            load_engine(f"vllm-v{self.release}")
        except ValueError:
            return None
        return f"vllm-v{self.release}"

    @property
    def fits(self) -> bool:
        """Whether the default profile's fit takes this run: on its device, under a release it spans."""
        return not self.anomalous and self.hardware == FIT_DEVICE and load_engine(DEFAULT_GPU_ENGINE).covers(self.release)

    def sim_config(self) -> SimConfig:
        return SimConfig(model=self.model, hardware=self.hardware, tp=self.tp, quant=self.quant,
                         kv_dtype=self.kv_dtype, engine=self.engine, **self.settings)

    def workload(self, time_scale: float = 1.0, prompts: int | None = None) -> Workload:
        """Every prompt, whatever time_scale: a closed loop's first wave starts in step, so fewer
        prompts would weigh its ramp more (prompts: fewer anyway, for a smoke run)."""
        spec = (f"synthetic:num={prompts or self.prompts},input={_lengths(self.isl, self.ratio)},"
                f"output={_lengths(self.osl, self.ratio)},concurrency={self.concurrency}")
        return load_workload(spec, seed=0)

    def figures(self, summary) -> dict[str, float]:
        """TPOT in the source's statistic and TTFT in ms (`ttft` in its own statistic, where it has one)."""
        def stat(dist, name: str) -> float:
            return 1e3 * (dist.mean if name == "mean" else dist.p50)
        out = {"tpot": stat(summary.tpot_s, self.tpot_stat), "ttft_mean": 1e3 * summary.ttft_s.mean,
               "e2e_mean": 1e3 * summary.e2e_s.mean}
        if self.ttft is not None:
            out["ttft"] = stat(summary.ttft_s, self.ttft[0])
        return out


def _lengths(length: int, ratio: float) -> str:
    low = round(length * ratio)
    return str(length) if low >= length else f"uniform({low},{length})"


_IX = dict(max_num_batched_tokens=8192, max_model_len=10240, enable_prefix_caching=False, gpu_memory_utilization=0.9)


def _ix828(tp: int, isl: int, osl: int, c: int, tpot: float, anomalous: bool = False) -> ClosedLoopRun:
    return ClosedLoopRun("IX828", "0.15", "h100-sxm", "gpt-oss-120b", tp, "mxfp4", isl, osl, c, 10 * c, "mean", tpot,
                         ratio=0.8, settings={**_IX, "max_num_seqs": c}, anomalous=anomalous,
                         note="flagged anomalous by its source" if anomalous else "")


_IX_MI300X = dict(max_model_len=2248, enable_prefix_caching=False, gpu_memory_utilization=0.95, block_size=64)


def _ix_mi300x(source: str, tp: int, c: int, prompts: int, stat: str, tpot: float,
               ttft: tuple[str, float] | None = None) -> ClosedLoopRun:
    return ClosedLoopRun(source, "0.17", "mi300x", "gpt-oss-120b", tp, "mxfp4", 1024, 1024, c, prompts, stat, tpot,
                         ttft, ratio=0.8, settings=_IX_MI300X)


def _fp8kv(model: str, quant: str, kv: str, ttft: float, itl: float) -> ClosedLoopRun:
    return ClosedLoopRun("FP8KV", "0.19", "h100-sxm", model, 1, quant, 23000, 2300, 8, 150, "p50", itl, ("p50", ttft),
                         ratio=0.74, kv_dtype=kv, settings={"max_model_len": 32768})


RUNS = [
    _ix828(8, 1024, 1024, 4, 3.72), _ix828(8, 1024, 1024, 8, 4.05), _ix828(8, 1024, 1024, 16, 4.83),
    _ix828(8, 1024, 1024, 32, 5.82), _ix828(8, 1024, 1024, 64, 7.36),
    _ix828(4, 1024, 1024, 64, 9.89), _ix828(2, 1024, 1024, 64, 15.21),
    _ix828(8, 1024, 8192, 4, 3.68), _ix828(8, 1024, 8192, 8, 4.00), _ix828(8, 1024, 8192, 16, 4.53),
    _ix828(8, 1024, 8192, 32, 5.65), _ix828(8, 1024, 8192, 64, 16.01, anomalous=True),
    _ix828(8, 8192, 1024, 4, 3.95), _ix828(8, 8192, 1024, 8, 4.59),
    _fp8kv("llama-3.1-8b", "bf16", "auto", 763.6, 15.18), _fp8kv("llama-3.1-8b", "bf16", "fp8", 742.8, 12.93),
    _fp8kv("gpt-oss-20b", "mxfp4", "auto", 468.9, 8.09), _fp8kv("gpt-oss-20b", "mxfp4", "fp8", 451.7, 7.90),
    ClosedLoopRun("PR23151", "0.10", "h100-sxm", "qwen3-30b-a3b", 1, "bf16", 2048, 1016, 10, 100, "mean", 13.18,
                  ("mean", 267.22), note="stock fused-MoE configuration"),
    ClosedLoopRun("EMMY", "0.17", "h200", "qwen3-30b-a3b", 1, "bf16", 4096, 4096, 1, 8, "mean", 4.62, ("mean", 135.8),
                  settings={"max_num_batched_tokens": 4096, "gpu_memory_utilization": 0.9}),
    ClosedLoopRun("PR25398", "0.11", "h100-pcie", "qwen3-30b-a3b", 2, "fp8", 7500, 7500, 64, 128, "mean", 38.88,
                  settings={"expert_parallel": True}),
    *(_ix_mi300x("IX1061", 1, c, 10 * c, "p50", tpot) for c, tpot in ((64, 31.4), (96, 36.6), (128, 41.3),
                                                                       (256, 58.3))),
    _ix_mi300x("IX1092", 8, 1, 64, "mean", 4.02, ("mean", 33.6)),
]


def fitted_runs() -> list[ClosedLoopRun]:
    """The closed-loop runs the default profile's fit takes."""
    return [run for run in RUNS if run.fits]
