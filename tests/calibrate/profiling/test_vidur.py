"""The Vidur importer reads the real A100/A40 profiles in ../shared and round-trips through export."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.profiling.vidur import export_vidur_compute, import_vidur_compute, import_vidur_network

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "profiles" / "vidur"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/profiles/vidur is not beside the checkout")


@needs_shared
def test_import_shapes_and_round_trip(tmp_path) -> None:
    source = SHARED / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    profile = import_vidur_compute(source)
    assert profile.hardware == "a100-80gb"
    qkv = [m for m in profile.of("gemm") if m.name == "qkv_proj" and dict(m.tags)["num_tensor_parallel_workers"] == 2]
    assert {(m.get("n"), m.get("k")) for m in qkv} == {(6144, 4096)}  # (32 + 2 * 32) heads x 128 / tp 2
    exported = tmp_path / "mlp.csv"
    export_vidur_compute(profile, exported)
    again = import_vidur_compute(exported, hardware="a100-80gb", model="meta-llama/Llama-2-7b-hf")
    assert len(again.measurements) == len(profile.measurements)
    for a, b in zip(profile.measurements, again.measurements):
        assert (a.op, a.params, a.name, a.tags) == (b.op, b.params, b.name, b.tags)
        assert b.time_s == pytest.approx(a.time_s, rel=1e-12)


@needs_shared
def test_network_import() -> None:
    profile = import_vidur_network(SHARED / "network" / "a100_dgx" / "all_reduce.csv", "a100-80gb")
    worlds = {m.get("world") for m in profile.of("all_reduce")}
    assert {2, 4, 8} <= worlds


def test_bad_vidur_files(tmp_path) -> None:
    bad = tmp_path / "a100" / "org" / "model"
    bad.mkdir(parents=True)
    (bad / "mlp.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a Vidur mlp.csv"):
        import_vidur_compute(bad / "mlp.csv")
    with pytest.raises(ValueError, match="no Vidur profile"):
        import_vidur_compute(tmp_path / "missing.csv")


def test_attention_csv_import(tmp_path) -> None:
    from calibrate.profiling.vidur import import_vidur_attention

    stats = ",".join(f"time_stats.{op}.{s}" for op in ("attn_prefill", "attn_decode", "attn_kv_cache_save")
                     for s in ("min", "max", "mean", "median", "std"))
    header = stats + ",n_embd,n_q_head,n_kv_head,block_size,num_tensor_parallel_workers,max_model_len,batch_size," \
                     "prefill_chunk_size,kv_cache_size,is_prefill,attention_backend"
    prefill = ",".join(["0.5"] * 5 + [""] * 5 + ["0.01"] * 5) + ",4096,32,8,16,2,4096,1,512,1024,True,FLASHINFER"
    decode = ",".join([""] * 5 + ["0.2"] * 5 + ["0.01"] * 5) + ",4096,32,8,16,2,4096,16,0,2047,False,FLASHINFER"
    path = tmp_path / "attention.csv"
    path.write_text(f"{header}\n{prefill}\n{decode}\n")
    profile = import_vidur_attention(path, hardware="a100-80gb")
    (p,) = profile.of("attention_prefill")
    (d,) = profile.of("attention_decode")
    assert dict(p.params) == dict(q_len=512, kv_len=1536, num_heads=16, num_kv_heads=4, head_dim=128, dtype="fp16")
    assert p.time_s == pytest.approx(0.5e-3) and d.get("batch") == 16 and d.get("kv_len") == 2048
    assert len(profile.of("kv_write")) == 2
    bad = tmp_path / "bad" / "attention.csv"
    bad.parent.mkdir()
    bad.write_text(header.replace("kv_cache_size", "kv") + "\n")
    with pytest.raises(ValueError, match="missing columns"):
        import_vidur_attention(bad, hardware="a100-80gb")
