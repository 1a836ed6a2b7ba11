"""The profiler times the engine's own operators, resumes, and feeds the cost model."""

from __future__ import annotations

import dataclasses

from calibrate.fitting.device import fit_framework, load_cost_model

import pytest

from calibrate.profiling.plan import ProfileGrid
from calibrate.profiling.profiler import Profiler
from engine.policy.config import ModelConfig
from simulator.cost.types import Chunk
from simulator.catalog.models import ModelSpec
from simulator.cost.profile_format import Profile
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import step_cost

TINY = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=512, max_position_embeddings=512)


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory) -> tuple[Profile, str]:
    path = tmp_path_factory.mktemp("prof") / "cpu.jsonl"
    profiler = Profiler(ModelConfig.from_hf(TINY), grid=ProfileGrid.quick())
    return profiler.run(path), str(path)


def test_profile_covers_every_operator_with_a_fingerprint(tiny_profile) -> None:
    profile, _ = tiny_profile
    ops = {m.op for m in profile.measurements}
    assert ops == {"gemm", "attention_prefill", "attention_decode", "attention_verify", "kv_write", "elementwise",
                   "sample", "step_overhead", "forward", "idle_wakeup"}
    assert {m.name for m in profile.of("gemm")} == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"}
    assert profile.hardware == "cpu-local" and profile.fingerprint["torch"] and profile.fingerprint["dtype"] == "fp32"
    assert profile.peaks["matmul_flops"] > 0 and profile.peaks["memory_bandwidth"] > 0
    assert all(m.time_s > 0 for m in profile.measurements)


def test_gemms_are_planned_at_every_decode_batch_size() -> None:
    """Decode batches run GEMMs at exactly their batch size in rows, so the budget's grid times
    every row count up to 32 (capped by the budget), GEMMs only; other operators keep the grid."""
    grid = ProfileGrid.for_budget(256, 512)
    assert set(range(1, 33)) <= set(grid.gemm_rows) and set(grid.tokens) <= set(grid.gemm_rows)
    assert 5 not in grid.tokens and 7 not in grid.tokens  # between the grid's points: measured, not interpolated
    assert ProfileGrid.for_budget(8).gemm_rows == tuple(range(1, 9))
    plan = Profiler(ModelConfig.from_hf(TINY), grid=grid).plan()
    for name in ("qkv_proj", "lm_head"):
        assert sorted(p["m"] for op, p in plan if op == "gemm" and p["name"] == name) == list(grid.gemm_rows)
    assert sorted(p["tokens"] for op, p in plan if op == "kv_write") == list(grid.tokens)
    assert ProfileGrid.quick().gemm_rows == ProfileGrid.quick().tokens


def test_resume_measures_only_what_is_missing(tiny_profile, tmp_path) -> None:
    profile, path = tiny_profile
    lines = open(path).read().splitlines()
    partial = tmp_path / "partial.jsonl"
    partial.write_text("\n".join(lines[: len(lines) // 2]) + "\n")  # interrupted half way
    kept = {m.key: m.time_s for m in Profile.load(partial).measurements}
    resumed = Profiler(ModelConfig.from_hf(TINY), grid=ProfileGrid.quick()).run(partial)
    assert len(resumed.measurements) == len(profile.measurements)
    assert all(kept[m.key] == m.time_s for m in resumed.measurements if m.key in kept)
    with pytest.raises(ValueError, match="choose another --out"):
        Profiler(ModelConfig.from_hf(TINY), dtype="bfloat16", grid=ProfileGrid.quick()).run(partial)


def test_cost_model_from_a_cpu_profile(tiny_profile) -> None:
    profile, path = tiny_profile
    model = load_cost_model("cpu-local", profile=path)
    m = profile.of("gemm")[0]
    measured = model.predict("gemm", m.get("m"), m.get("n"), m.get("k"), "fp32")
    assert measured.provenance == "measured" and measured.time_s == pytest.approx(m.time_s)
    spec = ModelSpec.from_hf_dict(TINY, "tiny")
    step = step_cost(model, ReplicaShape(spec, dtype="fp32", block_size=None),
                     [Chunk(8, 8), Chunk(1, 32), Chunk(1, 32)])
    assert step.total_s > 0 and step.provenance["qkv_proj"] in ("measured", "interpolated")
    other = ModelSpec.from_hf_dict({**TINY, "hidden_size": 96, "intermediate_size": 200}, "other")
    assert step_cost(model, ReplicaShape(other, dtype="fp32", block_size=None),
                     [Chunk(8, 8)]).provenance["qkv_proj"] == "fitted"


def test_the_explained_step_pads_decodes_as_the_simulated_step(tiny_profile) -> None:
    """servecast's own engine pads decodes in groups (engine/decode_groups.py): the explained step
    (predict, the fit) and the composition the framework fit reads count the groups the simulated
    step does."""
    from simulator.cost.step_timer import StepTimer, scheduled

    model = load_cost_model("cpu-local", profile=tiny_profile[1])
    shape = ReplicaShape(ModelSpec.from_hf_dict(TINY, "tiny"), dtype="fp32", block_size=16)
    chunks = [Chunk(1, c) for c in (5, 17, 33, 34, 90, 250)] + [Chunk(8, 8)]
    timer = StepTimer(model, shape)
    assert step_cost(model, shape, chunks).total_s == pytest.approx(timer.step(scheduled(chunks)), rel=1e-9)
    assert timer.compose(scheduled(chunks)).groups > 1 == StepTimer(model, ReplicaShape(
        shape.model, dtype="fp32", block_size=None)).compose(scheduled(chunks)).groups


def test_side_by_side_profiles_feed_the_held_out_check(tmp_path) -> None:
    from calibrate.fitting.heldout import cpu_held_out
    from calibrate.profiling.profiler import profile_side_by_side

    other = {**TINY, "hidden_size": 96, "intermediate_size": 160, "num_attention_heads": 3, "num_key_value_heads": 1,
             "vocab_size": 700}
    a, b = profile_side_by_side([(Profiler(ModelConfig.from_hf(TINY), grid=ProfileGrid.quick()), tmp_path / "a.jsonl"),
                                 (Profiler(ModelConfig.from_hf(other), grid=ProfileGrid.quick()), tmp_path / "b.jsonl")])
    assert len(a.measurements) == len(Profiler(ModelConfig.from_hf(TINY), grid=ProfileGrid.quick()).plan())
    result = cpu_held_out(a, b, (3, 1, 32))
    assert {"gemm:qkv_proj", "gemm:lm_head", "attention_decode", "all operators", "time-weighted"} <= set(result)
    assert all(r["mape"] >= 0 and r["n"] > 0 for r in result.values())
    assert sum(r["time_share"] for k, r in result.items() if k not in ("all operators", "time-weighted")) == (
        pytest.approx(1.0))


def test_tensor_parallel_profile_times_all_reduce(tmp_path) -> None:
    path = tmp_path / "tp2.jsonl"
    profile = Profiler(ModelConfig.from_hf(TINY), grid=ProfileGrid.quick(), tp=2).run(path)
    measured = profile.of("all_reduce")
    assert {m.get("world") for m in measured} == {2}
    assert {m.get("nbytes") for m in measured} == {t * 64 * 4 for t in ProfileGrid.quick().tokens}
    model = load_cost_model("cpu-local", profile=path)
    p = model.predict("all_reduce", measured[0].get("nbytes"), 2)
    assert p.provenance == "measured" and p.time_s == pytest.approx(measured[0].time_s)
    # Every other operator is one rank's shard: the simulator's tp=2 step reads it as measured.
    assert {(m.get("n"), m.get("k")) for m in profile.of("gemm") if m.name == "qkv_proj"} == {((4 + 2 * 2) * 16 // 2, 64)}
    spec = ModelSpec.from_hf_dict(TINY, "tiny")
    step = step_cost(model, ReplicaShape(spec, tp=2, dtype="fp32", block_size=None),
                     [Chunk(1, 32)] * 8)  # 8 tokens: a profiled size
    assert step.provenance["qkv_proj"] == "measured" and step.provenance["all_reduce"] != "extrapolated"
    with pytest.raises(ValueError, match="at least 1"):
        Profiler(ModelConfig.from_hf(TINY), tp=0)
    with pytest.raises(ValueError, match="does not divide the model's 4 attention heads"):
        Profiler(ModelConfig.from_hf(TINY), tp=3)


def test_context_parallel_profile_times_the_ring_hop_and_the_cost_model_reads_it(tmp_path) -> None:
    path = tmp_path / "cp2.jsonl"
    grid = dataclasses.replace(ProfileGrid.quick(), kv_gather_tokens=(64, 4096))
    profile = Profiler(ModelConfig.from_hf(TINY), grid=grid, cp=2).run(path)
    ring = profile.of("kv_ring")
    kv_size = 2 * 16  # 2 KV heads x head_dim 16
    # A rank's half of the context, K and V, float32.
    assert sorted(m.get("nbytes") for m in ring) == [32 * 2 * kv_size * 4, 2048 * 2 * kv_size * 4]
    assert {m.get("world") for m in ring} == {2} and {m.get("world") for m in profile.of("all_reduce")} == {2}
    model = load_cost_model("cpu-local", profile=path)
    small, large = sorted(ring, key=lambda m: m.get("nbytes"))
    p = model.predict("kv_ring", small.get("nbytes"), 2)
    assert p.provenance == "measured" and p.time_s == pytest.approx(small.time_s)
    assert model.predict("kv_ring", (small.get("nbytes") + large.get("nbytes")) // 2, 2).provenance \
        == "interpolated"
    # The operators are the whole model's: every rank holds it.
    assert {(m.get("n"), m.get("k")) for m in profile.of("gemm") if m.name == "qkv_proj"} == {((4 + 2 * 2) * 16, 64)}
    with pytest.raises(ValueError, match="one of --tp and --cp"):
        Profiler(ModelConfig.from_hf(TINY), tp=2, cp=2)


def test_moe_profile_times_experts_dispatch_and_all_to_all_and_the_cost_model_reads_them(tmp_path) -> None:
    import dataclasses

    raw = dict(TINY, model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
    config = dataclasses.replace(ModelConfig.from_hf(raw), expert_parallel=True)
    path = tmp_path / "moe.jsonl"
    profile = Profiler(config, grid=dataclasses.replace(ProfileGrid.quick(), expert_rows=(1, 8)), tp=2).run(path)
    experts = profile.of("moe_experts")
    # Expert parallel over 2 ranks: each holds 2 whole experts, timed with 1 and 2 of them active.
    assert {(m.get("active"), m.get("rows")) for m in experts} == {(1, 1), (1, 8), (2, 1), (2, 8)}
    assert {m.get("ffn") for m in experts} == {TINY["intermediate_size"]}
    assert {m.get("tokens") for m in profile.of("moe_dispatch")} == set(ProfileGrid.quick().tokens)
    assert {m.get("world") for m in profile.of("all_to_all")} == {2}
    model = load_cost_model("cpu-local", profile=path)
    point = experts[0]
    p = model.predict("moe_experts", point.get("rows"), point.get("active"), 64, TINY["intermediate_size"], "fp32")
    assert p.provenance == "measured" and p.time_s == pytest.approx(point.time_s)
    spec = ModelSpec.from_hf_dict(raw, "tiny-moe")
    step = step_cost(model, ReplicaShape(spec, tp=2, dtype="fp32", expert_parallel=True, block_size=None),
                     [Chunk(1, 32)] * 8)
    assert step.provenance["moe_dispatch"] == "measured" and step.provenance["all_to_all"] == "measured"


def test_attention_is_planned_at_other_head_dims_and_query_groups() -> None:
    """hidden 64: 4 query / 2 KV heads of 16; at head dim 32: 2/1; each also with 1 and 4 query heads per KV head."""
    grid = ProfileGrid(attention_head_dims=(32,), attention_groups=(1, 4))
    layouts = [(s["num_heads"], s["num_kv_heads"], s["head_dim"])
               for s in Profiler(ModelConfig.from_hf(TINY), grid=grid)._attention_shapes()]
    assert layouts[0] == (4, 2, 16)  # the model's own first
    assert sorted(layouts) == sorted([(4, 2, 16), (2, 1, 32), (2, 2, 16), (8, 2, 16), (1, 1, 32), (4, 1, 32)])
    assert len(set(layouts)) == len(layouts)


def test_quantized_linear_layers_are_profiled_and_read_by_the_cost_model(tmp_path) -> None:
    """gemm_quant points (the engine's int8 / int4 kernels) are what the cost model predicts for
    weight-only quantized GEMMs of those shapes."""
    from dataclasses import replace

    from calibrate.profiling.plan import ProfileGrid
    from calibrate.profiling.profiler import Profiler
    from engine.policy.config import ModelConfig

    config = ModelConfig.from_hf(dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=128))
    grid = replace(ProfileGrid.quick(), weight_quant=("int8", "int4", "w8a8"), quant_group_size=32,
                   kv_quant=("int8",), kv_gather_tokens=(64, 1024))
    profile = Profiler(config, grid=grid).run(tmp_path / "q.jsonl")
    points = {(m.get("weight_dtype"), m.get("n"), m.get("k"), m.get("m")): m.time_s for m in profile.of("gemm_quant")}
    assert {w for w, *_ in points} == {"int8", "int4", "w8a8"}
    # The fingerprint names the kernels each quantized shape ran: those the engine chooses here.
    from engine.linear import Linear
    from engine.quant_kernels import KernelChoice

    kernels = profile.fingerprint["quant_kernels"]
    assert set(kernels) == {f"{w} {n}x{k} g32" for w, n, k, _ in points}
    for key, text in kernels.items():
        mode, shape, _ = key.split()
        n, k = map(int, shape.split("x"))
        layer = Linear(k, n, bias=False)
        layer.quantize(mode, 32)
        assert layer.quantized.choice == KernelChoice.parse(text)
    model = load_cost_model("cpu-local", profile=str(tmp_path / "q.jsonl"))
    (weight, n, k, m), measured = next(iter(points.items()))
    prediction = model.predict("gemm", m, n, k, "fp32", weight_dtype=weight)
    assert prediction.time_s == pytest.approx(measured) and prediction.provenance == "measured"

    # The simulator models this engine's quantized runs with fp32 activations: its step's linear
    # layers are the gemm_quant points (8 tokens a step: a profiled size), not fp32 GEMMs.
    import json

    from simulator.fleet.sim_config import SimConfig
    from simulator.cost.step_timer import StepTimer

    hf = tmp_path / "config.json"
    hf.write_text(json.dumps(dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                  max_position_embeddings=128)))
    sim = SimConfig(model=str(hf), hardware="cpu-local", profile=str(tmp_path / "q.jsonl"), quant="int8",
                    activation_dtype="fp32")
    assert (sim.compute_dtype, sim.cache_dtype) == ("fp32", "fp32")
    assert SimConfig(model=str(hf), hardware="h100-sxm", quant="int8").compute_dtype == "bf16"  # W8A16
    spec = sim.model_spec()
    int8_ops = StepTimer(model, ReplicaShape(spec, dtype="fp32", weight_dtype="int8", kv_dtype="fp32")).token_ops(8)[0]
    fp32_ops = StepTimer(model, ReplicaShape(spec, dtype="fp32", kv_dtype="fp32")).token_ops(8)[0]
    linears = {name: (n, k) for name, (n, k) in spec.linear_shapes().items() if name != "lm_head"}
    quant_sum = sum(model.predict("gemm", 8, n, k, "fp32", weight_dtype="int8").time_s for n, k in linears.values())
    assert all(model.predict("gemm", 8, n, k, "fp32", weight_dtype="int8").provenance == "measured"
               for n, k in linears.values())
    float_sum = sum(model.predict("gemm", 8, n, k, "fp32").time_s for n, k in linears.values())
    assert int8_ops - fp32_ops == pytest.approx(quant_sum - float_sum, rel=1e-6)

    # An int8 KV cache: reads cost what the profile's dequantizing gathers cost over plain ones.
    gathers = {(m.get("kv_dtype"), m.get("tokens")): m.time_s for m in profile.of("kv_gather")}
    assert set(gathers) == {(kv, t) for kv in ("none", "int8") for t in (64, 1024)}
    plain = StepTimer(model, ReplicaShape(spec, dtype="fp32", kv_dtype="fp32"))
    quantized = StepTimer(model, ReplicaShape(spec, dtype="fp32", kv_dtype="int8"))
    # (each series is read as never falling with size: a noisy point reads as the one below it)
    envelope = {kv: max(gathers[(kv, 64)], gathers[(kv, 1024)]) for kv in ("none", "int8")}
    extra = max(0.0, envelope["int8"] - envelope["none"]) * spec.num_layers
    assert quantized.decode_attention(8, 1024) - plain.decode_attention(8, 1024) == pytest.approx(extra)
    assert quantized.prefill_attention(64, 1024) - plain.prefill_attention(64, 1024) == pytest.approx(extra)


def test_a_resumed_profile_times_the_quantized_kernels_it_recorded(tmp_path) -> None:
    import json
    from dataclasses import replace

    from calibrate.profiling.plan import ProfileGrid
    from calibrate.profiling.profiler import Profiler
    from engine.policy.config import ModelConfig
    from engine.linear import Linear

    config = ModelConfig.from_hf(dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=128))
    path = tmp_path / "r.jsonl"
    grid = replace(ProfileGrid.quick(), weight_quant=("int8",))
    Profiler(config, grid=grid).run(path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    recorded = header["fingerprint"]["quant_kernels"]
    header["fingerprint"]["quant_kernels"] = {key: "dequantize-int8" for key in recorded}  # as another run chose
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    Profiler(config, grid=replace(grid, weight_quant=("int8", "fp8"))).run(path)  # resumes: adds fp8
    n, k = map(int, next(iter(recorded)).split()[1].split("x"))
    layer = Linear(k, n, bias=False)
    layer.quantize("int8")
    assert set(layer.quantized.choice.kernels) == {"dequantize-int8"}


def test_verification_attention_is_read_from_its_own_measurements(tiny_profile) -> None:
    profile, path = tiny_profile
    model = load_cost_model("cpu-local", profile=path)
    spec = ModelSpec.from_hf_dict(TINY, "tiny")
    points = {(m.get("batch"), m.get("kv_len")): m.time_s for m in profile.of("attention_verify")}
    assert {b for b, _ in points} == {1, 4} and all(m.get("q_len") == 3 for m in profile.of("attention_verify"))
    # Four chunks of 3 tokens ending at context 128: the measured point, every layer (a series never
    # falls with context: a noisy point below a shorter context's reads as that one).
    step = step_cost(model, ReplicaShape(spec, dtype="fp32", block_size=None),
                     [Chunk(3, 128, verify=True)] * 4, include_host=False)
    assert step.by_operator["attention_verify"] == pytest.approx(2 * max(points[(4, 32)], points[(4, 128)]))
    # Two chunks: between the measured batches of one and four, linearly.
    two = step_cost(model, ReplicaShape(spec, dtype="fp32", block_size=None),
                    [Chunk(3, 32, verify=True)] * 2, include_host=False)
    expected = points[(1, 32)] + (points[(4, 32)] - points[(1, 32)]) / 3
    assert two.by_operator["attention_verify"] == pytest.approx(2 * expected)
    # Plain decodes are untouched by it.
    assert "attention_verify" not in step_cost(model, ReplicaShape(spec, dtype="fp32", block_size=None),
                                               [Chunk(1, 128)] * 4).by_operator


def test_verification_steps_observed_in_situ_get_their_own_overhead(tiny_profile) -> None:
    """Steps that verify drafts, observed 1 ms slower than their operators say (the draft ran in
    between), fit the verification terms; plain steps keep their fit (zero verify terms without
    such observations)."""
    from simulator.cost.types import StepObservation

    profile, path = tiny_profile
    spec = ModelSpec.from_hf_dict(TINY, "tiny")
    plain_model = load_cost_model("cpu-local", profile=path)
    assert "step_per_verify_s" not in plain_model.framework
    steps = []
    for batch in (1, 2, 4):
        for context in (32, 64, 128, 256):
            plain = [Chunk(1, context)] * batch
            verify = [Chunk(3, context, verify=True)] * batch
            shape = ReplicaShape(spec, dtype="fp32", block_size=16)
            steps.append(StepObservation(plain, spec, "fp32", 16, step_cost(plain_model, shape, plain).total_s))
            steps.append(StepObservation(verify, spec, "fp32", 16,
                                         step_cost(plain_model, shape, verify).total_s + 1e-3))
    fitted = load_cost_model("cpu-local", profile=path)
    # Fitted on these observations alone: the profile's forward points were timed on a shared
    # machine, and their noise would move the plain terms that the verify terms are measured
    # against (the observations are the plain fit exactly, plus 1 ms when verifying).
    no_forwards = Profile(profile.hardware, profile.fingerprint, profile.peaks, profile.source,
                          [m for m in profile.measurements if m.op != "forward"], profile.bandwidth_by_size)
    fitted = fitted.with_framework(fit_framework(fitted, no_forwards, steps))
    extra = fitted.framework["step_per_verify_s"] + spec.num_layers * fitted.framework["layer_per_verify_s"]
    assert extra == pytest.approx(1e-3, rel=0.25)
    verify = [Chunk(3, 64, verify=True)] * 2
    gap = (step_cost(fitted, ReplicaShape(spec, dtype="fp32", block_size=16), verify).total_s
           - step_cost(plain_model, ReplicaShape(spec, dtype="fp32", block_size=16), verify).total_s)
    assert gap == pytest.approx(1e-3, rel=0.3)


def test_each_sample_can_time_calls_back_to_back(monkeypatch) -> None:
    """On CUDA a sample is several queued calls and one sync; the time is per call."""
    import calibrate.profiling.operator_timing as profile_module
    from calibrate.profiling.operator_timing import median_time
    from calibrate.profiling.plan import ProfileGrid

    clock, syncs = [0.0], []
    monkeypatch.setattr(profile_module.time, "perf_counter", lambda: clock[0])

    def call() -> None:  # each call takes one second of the fake clock
        clock[0] += 1.0

    per_call = median_time(call, ProfileGrid(min_repeats=3, min_seconds=0.0), lambda: syncs.append(clock[0]), calls=4)
    assert syncs == [1.0, 5.0, 9.0, 13.0]  # the warm-up, then 3 samples of 4 calls, one sync each
    assert per_call == 1.0
