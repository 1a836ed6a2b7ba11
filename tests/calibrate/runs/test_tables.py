"""Real run summaries: reading the runs tables, rebuilding their workloads, and the engine fit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from calibrate.fitting.engine_profile import cross_validate, interval_coverage, summary_errors
from calibrate.runs.tables import RunsError, catalog_model, read_runs
from calibrate.runs.measured import Replayed
from simulator.catalog.engines import DEFAULT_GPU_ENGINE, load_engine
from simulator.workload.load import load_workload

RUNS_FILE = Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "vllm-runs.md"

TABLES = """
| Workload | Stages (req/s × s) | Nominal requests | System prompts × users | System-prompt tokens | Question tokens | Output tokens (forced) | Observed prompt_len mean (H100 runs) |
|---|---|---|---|---|---|---|---|
| chat | 2×60s → 4×30s | 240 | 3 × 2 (6 sessions) | 64 | 100 | 20 | ≈180–182 |
| chat-lite | 1×60s | 60 | 3 × 2 | 64 | 100 | 20 | n/a |

| ID | HF model | TP | Prec | mbt | gpu-mem | Workload | E2E mean | E2E p90 | E2E p99 | TTFT mean | TTFT p90 | TTFT p99 | TPOT mean |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
| a | `Qwen/Qwen2.5-7B-Instruct` | 1 | FP16 | 1024 | 0.9 (notes: run at 0.75) | chat | 140 | 150 | 160 | 30.5 | 40 | 50 | 5.76 |
| b | `meta-llama/Llama-3.1-8B-Instruct` | 2 | FP16 | 2048 | 0.9 | chat-lite | 120 | 125 | 130 | 25 | 30 | 35 | 5.0 |
"""


def test_runs_tables_are_read_with_their_presets(tmp_path) -> None:
    path = tmp_path / "runs.md"
    path.write_text(TABLES)
    a, b = read_runs(path, hardware="a100-80gb")
    assert (a.model, a.tp, a.max_num_batched_tokens, a.gpu_memory_utilization, a.hardware) == \
        ("qwen2.5-7b", 1, 1024, 0.75, "a100-80gb")
    assert a.measured == {"e2e_mean": 140, "e2e_p90": 150, "e2e_p99": 160, "ttft_mean": 30.5, "ttft_p90": 40,
                          "ttft_p99": 50, "tpot": 5.76}
    assert a.output_tokens == 20 and a.output_mean == pytest.approx((140 - 30.5) / 5.76 + 1)
    assert a.prompt_mean == 181 and b.prompt_mean == 181  # the lite preset takes its base's observed length
    w = load_workload(a.spec())
    assert len(w) == 2 * 60 + 4 * 30 and {r.prompt_tokens for r in w} == {181} and {r.output_tokens for r in w} == {20}
    assert len({r.segments for r in w}) == 6 and not a.saturated
    assert len(load_workload(a.spec(0.5))) == 60 + 60


@pytest.mark.parametrize("text, message", [
    ("| x |\n|---|\n| 1 |\n", "no table with an 'E2E mean' column"),
    (TABLES.replace("| chat-lite |", "| nope |", 1), "has no preset"),
    (TABLES.replace("`Qwen/Qwen2.5-7B-Instruct`", "`someone/unknown-7b`"), "not in the catalog"),
])
def test_bad_runs_files_name_the_fix(tmp_path, text, message) -> None:
    path = tmp_path / "runs.md"
    path.write_text(text)
    with pytest.raises(RunsError, match=message):
        read_runs(path)
    with pytest.raises(RunsError, match="no such runs file"):
        read_runs(tmp_path / "missing.md")


def test_catalog_model_names() -> None:
    assert catalog_model("meta-llama/Llama-3.1-70B-Instruct") == "llama-3.1-70b"
    assert catalog_model("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic") == "llama-4-scout"
    assert catalog_model("mistralai/Mistral-Nemo-Instruct-2407") == "mistral-nemo"
    assert catalog_model("codellama/CodeLlama-34b-Instruct-hf") == "codellama-34b"
    with pytest.raises(RunsError, match="not in the catalog"):  # all of it dropped as a suffix: nothing to match
        catalog_model("Instruct")


@pytest.mark.skipif(not RUNS_FILE.is_file(), reason="../shared/reference is not beside the checkout")
def test_the_shared_runs_file() -> None:
    runs = read_runs(RUNS_FILE)
    assert len(runs) == 21 and sum(r.saturated for r in runs) == 4  # the codegen row given twice counts once
    scout = next(r for r in runs if r.id == "17")
    assert scout.quant == "fp8" and scout.model == "llama-4-scout" and scout.preset.stages == ((2.5, 600), (6, 600))
    d1 = [r for r in runs if r.family == "llama-2-7b" and r.preset.name == "codegen"]
    assert len(d1) == 1 and d1[0].output_mean == 195


def test_fit_lowers_the_error_and_cross_validates(tmp_path) -> None:
    path = tmp_path / "runs.md"
    path.write_text(TABLES.replace("| 2 | FP16 | 2048", "| 1 | FP16 | 2048"))
    runs = read_runs(path, hardware="h100-sxm")
    base = load_engine(DEFAULT_GPU_ENGINE)
    result = cross_validate(base, runs, fit_time_scale=0.25, time_scale=0.25, max_evaluations=20, min_fit_s=0.0)
    start = summary_errors([Replayed(r, p.predicted) for r, p in zip(runs, result.in_sample)])
    assert result.profile.errors["in_sample"] == start
    assert len(result.leave_one_run_out) == len(runs) == len(result.leave_one_model_out)
    assert set(result.profile.residuals) >= {"e2e_mean", "ttft_mean", "tpot"}
    assert result.profile.request_s > 0 and "h100-sxm" in result.profile.device_scales
    assert interval_coverage(result.leave_one_run_out, "e2e_mean")[1] == 2
    # The fitted profile predicts both runs at least as well as the unfitted one in sample.
    from calibrate.fitting.engine_profile import predict
    before = summary_errors([predict(replace(base, request_s=0.0), r, 0.25) for r in runs])
    assert result.profile.errors["in_sample"]["ttft_mean_mdape"] < before["ttft_mean_mdape"]


def test_saturated_runs_are_fitted_on_their_tpot_alone(tmp_path) -> None:
    from calibrate.fitting.engine_profile import SATURATED_FIT_METRICS, fit_engine
    path = tmp_path / "runs.md"
    overloaded = "| c | `Qwen/Qwen2.5-7B-Instruct` | 1 | FP16 | 1024 | 0.9 | chat | 90000 | 95000 | 99000 | 60000 | 70000 | 80000 | 7.0 |\n"
    path.write_text(TABLES.replace("| 2 | FP16 | 2048", "| 1 | FP16 | 2048") + overloaded)
    runs = read_runs(path, hardware="h100-sxm")
    assert [r.saturated for r in runs] == [False, False, True]
    *_, resid = fit_engine(load_engine(DEFAULT_GPU_ENGINE), runs, time_scale=0.25, max_evaluations=0, min_s=0.0)
    assert SATURATED_FIT_METRICS == ("tpot",) and len(resid) == 3 + 3 + 1
    with pytest.raises(ValueError, match="every run given was overloaded"):
        fit_engine(load_engine(DEFAULT_GPU_ENGINE), runs[2:], max_evaluations=0)


def test_a_refit_resets_only_what_the_held_out_runs_alone_informed(tmp_path) -> None:
    import numpy as np

    from calibrate.fitting.engine_profile import DEVICE_START, SHARED, SHARED_START, refit_without
    path = tmp_path / "runs.md"
    path.write_text(TABLES.replace("| 2 | FP16 | 2048", "| 1 | FP16 | 2048"))
    runs = read_runs(path, hardware="h100-sxm")
    theta = np.array([*SHARED_START, *DEVICE_START]) * 1.1  # away from the starting values
    owner = np.array([0, 0, 0, 1, 1, 1])
    jac = np.ones((6, len(theta)))
    pinned, told = SHARED.index("elementwise"), SHARED.index("moe")
    jac[:, pinned] = 0.0  # no run moves it (a speed at the roofline): it keeps its value
    jac[:3, told] = 0.0  # only run 1 informs it: held out, it goes back to its start
    out, moved = refit_without(load_engine(DEFAULT_GPU_ENGINE), runs, ["h100-sxm"], theta, jac, np.zeros(6), owner,
                               [1], time_scale=0.25, min_s=0.0)
    assert out[pinned] == theta[pinned] and out[told] == SHARED_START[told] and moved
