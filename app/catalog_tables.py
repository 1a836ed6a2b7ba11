"""What the catalog holds, as rows: the models, the accelerators (with price, memory and how far
their costs are known) and the serving-engine profiles. One source for `servecast catalog` and
the app's Catalog page."""

from __future__ import annotations

from simulator.fleet.costs import EXTRAPOLATED, KERNELS_FITTED, VALIDATED

# The cost basis of an accelerator in words (simulator/fleet/costs.py cost_basis).
BASIS_WORDS = {VALIDATED: "validated on real serving runs", KERNELS_FITTED: "kernels fitted on its own profiles",
               EXTRAPOLATED: "extrapolated (another device's curves)"}
SECTIONS = ("models", "hardware", "engines")
TITLES = {"models": "Models (catalog ids; any HF config.json path works too)",
          "hardware": "Accelerators (a plan's candidates are the priced ones)",
          "engines": "Serving-engine profiles (error: cross-validated median on real runs, leave one run out)"}
# Column headers of the rows' keys, for the terminal and the app.
LABELS = {"parameters_b": "parameters (B)", "active_parameters_b": "active (B)", "kv_heads": "KV heads",
          "memory_gb": "memory (GB)", "bandwidth_tb_s": "bandwidth (TB/s)", "bf16_tflops": "bf16 TFLOPS",
          "fp8_tflops": "fp8 TFLOPS", "usd_per_hour": "$ / hour", "fitted_on": "fitted on",
          "validated_on": "validated on", "e2e_mean_error_pct": "E2E mean error (%)",
          "ttft_p99_error_pct": "TTFT p99 error (%)", "tpot_error_pct": "TPOT error (%)"}


def label(key: str) -> str:
    return LABELS.get(key, key.replace("_", " "))


def model_rows() -> list[dict]:
    from simulator.catalog.models import catalog_model_ids, load_model

    rows = []
    for model_id in catalog_model_ids():
        m = load_model(model_id)
        rows.append({"model": model_id, "parameters_b": round(m.num_parameters() / 1e9, 2),
                     "active_parameters_b": round(m.active_parameters() / 1e9, 2), "layers": m.num_layers,
                     "hidden": m.hidden_size, "heads": m.num_heads, "kv_heads": m.num_kv_heads,
                     "experts": m.num_experts if m.is_moe else None, "context": m.max_position_embeddings})
    return rows


def hardware_rows(hardware_file: str | None = None) -> list[dict]:
    from simulator.catalog.engines import DEFAULT_GPU_ENGINE, load_engine
    from simulator.catalog.hardware import load_hardware
    from simulator.fleet.costs import accelerator_basis

    engine = load_engine(DEFAULT_GPU_ENGINE)
    rows = []
    for hardware_id, a in load_hardware(hardware_file).items():
        basis = accelerator_basis(a, engine)
        rows.append({"hardware": hardware_id, "name": a.name, "memory_gb": a.memory_gb,
                     "bandwidth_tb_s": a.memory_bandwidth_gbps / 1e3 if a.memory_bandwidth_gbps else None,
                     "bf16_tflops": a.peak_tflops.get("bf16"), "fp8_tflops": a.peak_tflops.get("fp8"),
                     "usd_per_hour": a.price_per_hour_usd, "costs": "profiled on this machine" if a.profiled
                     else BASIS_WORDS[basis]})
    return rows


def engine_rows() -> list[dict]:
    from simulator.catalog.engines import engine_ids, load_engine

    rows = []
    for engine_id in engine_ids():
        e = load_engine(engine_id)
        # A profile that inherits its fitted terms has no runs, errors or validated devices of its own.
        own = not e.transferred_from
        cv = e.errors.get("leave_one_run_out", {}) if own else {}
        rows.append({"engine": engine_id, "description": e.description or "kernel time alone",
                     "fitted_on": (e.fitted_on or None) if own else f"no runs of its own: {e.transferred_from}'s terms",
                     "validated_on": (sorted(e.device_scales) or None) if own else None,
                     "e2e_mean_error_pct": cv.get("e2e_mean_mdape"), "ttft_p99_error_pct": cv.get("ttft_p99_mdape"),
                     "tpot_error_pct": cv.get("tpot_mdape")})
    return rows


def catalog() -> dict[str, list[dict]]:
    return {"models": model_rows(), "hardware": hardware_rows(), "engines": engine_rows()}
