"""One configuration, declared once: SimConfig's knobs live in their groups (simulator/fleet/knobs.py)
and every command that takes a group has an option per field, named, typed, defaulted and helped
as declared (app/knob_options.py)."""

from __future__ import annotations

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from app.cli import app
from app.knob_options import Knobs, Options, declared, help_text, option_type, takes
from simulator.fleet.knobs import GROUPS, Fleet, Parallelism, knob
from simulator.fleet.sim_config import SimConfig

runner = CliRunner()
COMMANDS = typer.main.get_command(app).commands


def options_of(command: str) -> dict[str, object]:
    """A command's options by their first flag (--tp, --chunked-prefill, ...)."""
    return {p.opts[0]: p for p in COMMANDS[command].params if p.opts}


def test_simconfig_is_its_groups_fields_flat_and_in_order() -> None:
    fields = [name for group in GROUPS for name in group.model_fields]
    assert list(SimConfig.model_fields) == fields and len(set(fields)) == len(fields)
    config = SimConfig(model="llama-3.1-8b", hardware="h100-sxm", tp=4, enable_prefix_caching=False)
    assert (config.tp, config.enable_prefix_caching) == (4, False)
    assert config.model_copy(update={"tp": 2}).tp == 2 and list(config.model_dump()) == fields


@pytest.mark.parametrize("command", ["simulate", "plan", "predict", "validate", "serve", "generate"])
def test_every_field_a_command_takes_is_its_option_as_declared(command) -> None:
    sets = COMMANDS[command].callback.option_sets
    options = options_of(command)
    for s in sets:
        if not s.only:  # a whole group: every field, also one added later
            assert s.fields == tuple(s.group.model_fields)
        for name in s.fields:
            info = s.group.model_fields[name]
            option = options[f"--{s.flag(name)}"]
            assert option.help.startswith(help_text(info, option_type(info.annotation)[1]))
            if name not in s.defaults and info.is_required():
                assert option.required or command == "simulate"  # simulate: or --replay
            elif name not in s.defaults and info.default_factory is None:
                assert option.default == info.default, (command, name)


def test_simulate_takes_every_knob() -> None:
    options = options_of("simulate")
    flags = {f"--{s.flag(name)}" for s in COMMANDS["simulate"].callback.option_sets for name in s.fields}
    assert len(flags) == len(SimConfig.model_fields) and flags <= set(options)


def test_a_field_added_to_a_group_is_an_option_of_a_command_that_takes_the_group() -> None:
    class Wider(Parallelism):
        zigzag: int = knob(3, "a throwaway knob", ge=1)

    seen = {}

    @takes(Options(Wider), Options(Fleet, only=("replicas",), defaults={"replicas": 2}, names={"replicas": "copies"}))
    def command(knobs: Knobs = None, out: str = typer.Option("x")) -> None:
        seen.update(knobs)

    demo = typer.Typer()
    demo.command()(command)
    demo.command("other")(lambda: None)
    help_out = runner.invoke(demo, ["command", "--help"], env={"COLUMNS": "200"}).output
    assert "--zigzag" in help_out and "a throwaway knob" in help_out and "--no-expert-parallel" in help_out
    assert "--copies" in help_out and "[default: 2]" in help_out and "--out" in help_out
    result = runner.invoke(demo, ["command", "--zigzag", "5", "--expert-parallel"])
    assert result.exit_code == 0, result.output
    assert seen == {"tp": 1, "pp": 1, "cp": 1, "expert_parallel": True, "routing_skew": 0.0, "zigzag": 5,
                    "replicas": 2}
    with pytest.raises(TypeError, match="no field"):
        Options(Parallelism, only=("nope",))
    with pytest.raises(TypeError, match="twice"):
        takes(Options(Parallelism), Options(Wider))(lambda knobs=None: None)


def test_the_engine_commands_keep_their_own_defaults_for_the_shared_knobs() -> None:
    # None: the serving engine's default for the GPU, resolved by SimConfig (engine_defaults.py).
    for command, seqs, tokens, blocks in (("simulate", None, None, None), ("validate", 32, 256, 512),
                                          ("serve", 64, 512, None), ("generate", 64, 512, None),
                                          ("predict", None, None, ...), ("plan", None, None, None)):
        options = options_of(command)
        assert (options["--max-num-seqs"].default, options["--max-num-batched-tokens"].default) == (seqs, tokens)
        if blocks is not ...:
            flag = "--num-gpu-blocks" if command in ("simulate", "plan") else "--num-blocks"
            assert options[flag].default == blocks


def test_from_replay_is_every_recorded_knob_and_the_trace() -> None:
    from app.simulate_command import FROM_REPLAY, KEPT_ON_REPLAY

    # The hand list it replaced, less nothing: a replay records all of these.
    assert set(FROM_REPLAY) == {
        "model", "trace", "tp", "pp", "cp", "replicas", "quant", "kv_dtype", "activation_dtype", "block_size",
        "max_num_seqs", "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization", "num_gpu_blocks",
        "chunked_prefill", "prefix_caching", "scheduler", "router", "rate_scale", "seed", "speculative",
        "num_speculative_tokens", "acceptance", "acceptance_file", "acceptance_preset", "draft_model", "draft_profile",
        "expert_parallel",
        "routing_skew", "kv_offload_gb", "disaggregate", "prefill_hardware", "prefill_tp", "prefill_quant",
        "prefill_cp", "kv_transfer_gbps", "kv_transfer_latency_s", "max_concurrency"}
    assert set(KEPT_ON_REPLAY) == {"hardware", "hardware_file", "profile", "slo", "engine", "engine_file",
                                   "timeseries_interval_s"}


def test_the_cli_defaults_are_simconfigs() -> None:
    sets = COMMANDS["simulate"].callback.option_sets
    values = {name: ("" if s.group.model_fields[name].default_factory else s.parameter(name).default.default)
              for s in sets for name in s.fields}
    values.update(model="llama-3.1-8b", hardware="h100-sxm")
    assert SimConfig(**values) == SimConfig(model="llama-3.1-8b", hardware="h100-sxm")


@pytest.mark.parametrize("args, message", [
    (["plan", "--hardware", "h100-sxm", "--block-size", "0"], "--block-size: Input should be greater than"),
    (["predict", "--hardware", "h100-sxm", "--model", "llama-2-7b", "--routing-skew", "-1"], "--routing-skew:"),
    (["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--trace", "synthetic:num=5",
      "--timeseries-interval-s", "0"], "--timeseries-interval-s:"),
])
def test_a_bad_knob_is_one_line_and_status_2(args, message) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_the_chunked_prefill_rule_is_one_rule() -> None:
    from pydantic import ValidationError

    from engine.policy.config import SchedulerConfig

    with pytest.raises(ValueError) as engine_error:
        SchedulerConfig(max_num_batched_tokens=64, max_model_len=128, enable_chunked_prefill=False)
    with pytest.raises(ValidationError) as sim_error:
        SimConfig(model="m", hardware="h", max_num_batched_tokens=64, max_model_len=128, enable_chunked_prefill=False)
    assert str(engine_error.value) in str(sim_error.value)


def test_declared_finds_a_knob_in_its_group() -> None:
    assert declared("kv_offload_gb").default == 0.0 and declared("tp").description
