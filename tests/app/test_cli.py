"""The servecast CLI: the bundled job runs, --json is machine-readable, bad input exits 2 in one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from app.cli import app

runner = CliRunner()
SMALL = ["generate", "--num-requests", "4", "--rate", "inf", "--length-scale", "0.02", "--max-total-tokens", "96"]


def test_generate_json_summary_and_out_dir(tmp_path) -> None:
    result = runner.invoke(app, [*SMALL, "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["num_requests"] == 4
    assert summary["throughput"]["output_tokens_per_s"] > 0
    assert summary["ttft_s"]["p50"] <= summary["e2e_s"]["p99"]
    assert json.loads((tmp_path / "summary.json").read_text())["num_requests"] == 4
    assert len((tmp_path / "requests.csv").read_text().strip().splitlines()) == 5


def test_generate_with_a_local_model_directory(tmp_path) -> None:
    from tests.tiny_models import hf_model

    hf_model("qwen2-bias").save_pretrained(tmp_path)
    result = runner.invoke(app, [*SMALL, "--model", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["engine"]["model"] == str(tmp_path) and summary["num_requests"] == 4


def test_generate_with_tensor_parallel_ranks_and_int8_weights() -> None:
    result = runner.invoke(app, [*SMALL, "--tp", "2", "--quantization", "int8", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["engine"]["tensor_parallel_size"] == 2 and summary["engine"]["quantization"] == "int8"
    assert summary["num_requests"] == 4 and summary["throughput"]["output_tokens_per_s"] > 0


def test_generate_prints_a_table() -> None:
    result = runner.invoke(app, SMALL)
    assert result.exit_code == 0, result.output
    assert "Per-request timings" in result.stdout and "req-3" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--rate", "fast"], "--rate must be a number"),
    (["--rate", "0"], "--rate must be positive"),
    (["--block-size", "0"], "block_size must be positive"),
    (["--dtype", "int3"], "dtype 'int3' is not supported"),
    (["--device", "tpu"], "unknown device"),
    (["--lengths", "/nonexistent.csv"], "no length file"),
    (["--num-requests", "0"], "num_requests must be positive"),
    (["--max-num-batched-tokens", "8", "--no-chunked-prefill"], "without chunked prefill"),
    (["--tp", "3"], "does not divide the model's 8 attention heads"),
    (["--quantization", "int3"], "quantization 'int3' is not supported"),
    (["--kv-cache-dtype", "int4"], "kv_cache_dtype 'int4' is not supported"),
])
def test_bad_input_exits_2_with_one_line(args, message) -> None:
    result = runner.invoke(app, [*SMALL, *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output and len(result.stderr.strip().splitlines()) == 1


def test_bad_length_rows_are_reported_by_line(tmp_path) -> None:
    path = tmp_path / "lengths.csv"
    path.write_text("prompt_tokens,output_tokens\n10,5\n12,x\n")
    result = runner.invoke(app, [*SMALL, "--lengths", str(path)])
    assert result.exit_code == 2 and f"{path}:3" in result.stderr


def test_predict_json_has_per_operator_provenance() -> None:
    result = runner.invoke(app, ["predict", "--hardware", "h100-sxm", "--model", "llama-2-7b", "--tokens", "512",
                                 "--tp", "2", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["step_time_s"] == pytest.approx(sum(op["time_s"] for op in out["operators"].values()))
    assert out["operators"]["qkv_proj"]["provenance"] == "extrapolated"
    assert "all_reduce" in out["operators"]
    # On the accelerator whose kernel profiles the shipped curves were fitted on, its GEMMs and
    # elementwise operators are fitted; attention, which those profiles do not cover, is not.
    a100 = json.loads(runner.invoke(app, ["predict", "--hardware", "a100-80gb", "--model", "llama-2-7b",
                                          "--json"]).stdout)["operators"]
    assert a100["qkv_proj"]["provenance"] == a100["rms_norm"]["provenance"] == "fitted"
    assert a100["attention_prefill"]["provenance"] == "extrapolated"


def test_predict_says_the_kv_cache_vllm_would_size() -> None:
    args = ["predict", "--hardware", "h200", "--model", "llama-3.1-70b", "--tp", "4", "--gpu-memory-utilization",
            "0.92", "--max-num-seqs", "1024", "--max-model-len", "8192"]
    kv = json.loads(runner.invoke(app, [*args, "--json"]).stdout)["kv_cache"]
    # vLLM 0.13 logged 90.23 GiB and 1,182,608 tokens for Llama-3.3-70B so (docs/kv-capacity.md).
    assert kv["available_gib"] == pytest.approx(90.23, rel=0.05) and kv["tokens"] == pytest.approx(1_182_608, rel=0.05)
    assert kv["max_concurrency"] == pytest.approx(kv["tokens"] / 8192)
    text = runner.invoke(app, args)
    assert text.exit_code == 0 and "KV cache per GPU" in text.output and "tokens" in text.output
    fp8 = json.loads(runner.invoke(app, [*args, "--kv-dtype", "fp8", "--json"]).stdout)["kv_cache"]
    assert fp8["tokens"] == pytest.approx(2 * kv["tokens"], rel=0.001)
    none = json.loads(runner.invoke(app, ["predict", "--hardware", "l4", "--model", "llama-3.1-70b",
                                          "--json"]).stdout)["kv_cache"]
    assert none["error"] and "tp" in none["error"]


@pytest.mark.parametrize("args, message", [
    (["--hardware", "h100-sxm", "--model", "gpt-9"], "unknown model"),
    (["--hardware", "warp", "--model", "llama-2-7b"], "unknown hardware"),
    (["--hardware", "h100-sxm", "--model", "llama-2-7b", "--tp", "3"], "must divide"),
    (["--hardware", "cpu-local", "--model", "llama-2-7b"], "pass its profile"),
    (["--hardware", "h100-sxm", "--model", "llama-2-7b", "--tokens", "0"], "--tokens must be positive"),
    (["--hardware", "h100-sxm", "--model", "llama-2-7b", "--decode-batch", "8", "--context", "0"], "--context"),
])
def test_predict_bad_input(args, message) -> None:
    result = runner.invoke(app, ["predict", *args])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output


def test_predict_reads_only_the_options_its_step_uses() -> None:
    # --tokens is the prefill's; a decode step ignores it, whatever its value.
    result = runner.invoke(app, ["predict", "--hardware", "h100-sxm", "--model", "llama-2-7b", "--tokens", "0",
                                 "--decode-batch", "32", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["step"] == {"decode_batch": 32, "context": 1024}


def test_profile_then_predict_with_it(tmp_path) -> None:
    out = tmp_path / "new" / "cpu.jsonl"  # its folder is made
    result = runner.invoke(app, ["profile", "--quick", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["measurements"] > 0
    # The demo model is in the catalog, so the simulator names it as the engine serves it.
    result = runner.invoke(app, ["predict", "--hardware", "cpu-local", "--profile", str(out), "--model",
                                 "servecast-demo", "--tokens", "8", "--dtype", "fp32", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["operators"]["qkv_proj"]["provenance"] in ("measured", "interpolated")
    bad = runner.invoke(app, ["profile", "--quick", "--out", str(out), "--dtype", "bfloat16"])
    assert bad.exit_code == 2 and "choose another --out" in bad.stderr
    folder = runner.invoke(app, ["profile", "--quick", "--out", str(tmp_path)])
    assert folder.exit_code == 2 and "is a folder" in folder.stderr


def test_calibrate_refits_into_a_given_file(tmp_path) -> None:
    from pathlib import Path

    shared = Path(__file__).resolve().parents[2].parent / "shared"
    if not (shared / "profiles" / "vidur").is_dir():
        pytest.skip("../shared/profiles/vidur is not beside the checkout")
    out = tmp_path / "efficiency.json"
    result = runner.invoke(app, ["calibrate", "--shared", str(shared), "--out", str(out)])
    assert result.exit_code == 0, result.output
    params = json.loads(out.read_text())
    assert {"gemm", "gemm:qkv_proj", "memory"} <= set(params["curves"])
    assert set(params["held_out_a40_mape"]) >= {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
    bad = runner.invoke(app, ["calibrate", "--shared", str(tmp_path), "--out", str(out)])
    assert bad.exit_code == 2 and "no Vidur a100 profiles" in bad.stderr


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--replicas", "abc"], "error: Invalid value for '--replicas'"),
    (["simulate", "--bogus"], "error: No such option: --bogus"),
    (["nosuch"], "error: No such command 'nosuch'. (`servecast --help` lists the options)"),
])
def test_a_malformed_command_line_is_one_line_and_exit_2(argv, message, monkeypatch, capsys) -> None:
    from app.cli import main

    monkeypatch.setattr("sys.argv", ["servecast", *argv])
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.startswith(message) and len(err.strip().splitlines()) == 1, err


def test_the_entry_point_keeps_exit_statuses_and_help(monkeypatch, capsys) -> None:
    from app.cli import main

    for argv, status in ((["--help"], 0), ([], 2)):
        monkeypatch.setattr("sys.argv", ["servecast", *argv])
        with pytest.raises(SystemExit) as exited:
            main()
        assert exited.value.code == status and "Usage:" in capsys.readouterr().out


def test_a_hardware_file_that_is_not_yaml_is_one_line(tmp_path) -> None:
    bad = tmp_path / "gpus.yaml"
    bad.write_text("my-gpu:\n  memory_gb: [1, 2\n  price_per_hour_usd: 3\n")
    result = runner.invoke(app, ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--hardware-file",
                                 str(bad), "--trace", "synthetic:num=5"])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.output
    assert f"{bad} is not valid YAML: did not find expected ',' or ']' at line 3" in result.stderr


def test_catalog_lists_models_hardware_and_engines() -> None:
    result = runner.invoke(app, ["catalog", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    models = {r["model"]: r for r in out["models"]}
    assert 7.5 < models["llama-3.1-8b"]["parameters_b"] < 8.5 and models["mixtral-8x7b"]["experts"] == 8
    hardware = {r["hardware"]: r for r in out["hardware"]}
    assert hardware["h100-sxm"]["costs"] == "validated on real serving runs" and hardware["h100-sxm"]["usd_per_hour"]
    assert hardware["a100-80gb"]["costs"].startswith("kernels fitted") and hardware["l4"]["memory_gb"] == 24
    engines = {r["engine"]: r for r in out["engines"]}
    assert engines["vllm-v0.15"]["validated_on"] == ["h100-sxm"] and engines["vllm-v0.15"]["e2e_mean_error_pct"] > 0
    table = runner.invoke(app, ["catalog", "hardware"], env={"COLUMNS": "160"})
    assert table.exit_code == 0 and "$ / hour" in table.output and "mistral" not in table.output
    bad = runner.invoke(app, ["catalog", "gpus"])
    assert bad.exit_code == 2 and "use models, hardware or engines" in bad.stderr


def test_help_lists_options_without_str_and_bool_type_labels() -> None:
    for command in ("simulate", "plan", "predict", "serve", "catalog"):
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "160"})
        assert result.exit_code == 0 and "--help" in result.output
        assert "<str>" not in result.output and "<bool>" not in result.output, command
    assert "<int>" in runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "160"}).output  # numbers keep theirs


def test_predict_times_the_step_the_simulator_runs() -> None:
    # --quant sets the bytes a step reads: mxfp4 experts are about a quarter of bf16 ones, and the
    # step is the simulator's own for that replica (SimConfig's shape), not one at --dtype's weights.
    from simulator.catalog.models import load_model
    from simulator.cost.step_timer import step_cost
    from simulator.cost.types import Chunk
    from simulator.fleet.costs import cost_model_for
    from simulator.fleet.fleet import replica_shape
    from simulator.fleet.sim_config import SimConfig

    args = ["predict", "--hardware", "h100-sxm", "--model", "gpt-oss-120b", "--tp", "8", "--decode-batch", "4",
            "--context", "1500", "--json"]
    bf16 = json.loads(runner.invoke(app, args).stdout)
    mxfp4 = json.loads(runner.invoke(app, [*args, "--quant", "mxfp4"]).stdout)
    assert mxfp4["dtype"] == "bf16" and mxfp4["quant"] == "mxfp4"
    assert mxfp4["operators"]["moe_experts"]["time_s"] < 0.75 * bf16["operators"]["moe_experts"]["time_s"]
    assert mxfp4["operators"]["qkv_proj"] == bf16["operators"]["qkv_proj"]  # attention stays in bf16
    config = SimConfig(model="gpt-oss-120b", hardware="h100-sxm", tp=8, quant="mxfp4")
    simulated = step_cost(cost_model_for(config, None), replica_shape(config, load_model("gpt-oss-120b")),
                          [Chunk(1, 1500)] * 4)
    assert mxfp4["step_time_s"] == pytest.approx(simulated.total_s)
    fp8 = json.loads(runner.invoke(app, [*args, "--kv-dtype", "fp8"]).stdout)["operators"]
    assert fp8["attention_decode"]["time_s"] < bf16["operators"]["attention_decode"]["time_s"]
