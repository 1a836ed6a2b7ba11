"""The Vidur importer reads the real A100/A40 profiles in ../shared and round-trips through export."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.vidur import export_vidur_compute, import_vidur_compute, import_vidur_network

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "profiles" / "vidur"
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
