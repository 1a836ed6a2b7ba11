"""The Streamlit app: every page renders, widgets change the answer, bad input shows the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app.dashboard.inputs import MAX_UPLOAD_BYTES, workload_from_upload
from simulator.workload.requests import WorkloadError

SHIPPED_PROFILES = Path(__file__).resolve().parents[2] / "profiles"

PAGES = Path(__file__).resolve().parents[2] / "app" / "dashboard"


def chart_spec(element) -> str:
    """A plotly chart element's figure JSON (where this Streamlit version keeps it)."""
    proto = element.proto
    return proto.spec if getattr(proto, "spec", "") else proto.figure.spec


def table(at: AppTest, column: str):
    """The frame of the first st.dataframe with this column."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def page(name: str) -> AppTest:
    at = AppTest.from_file(str(PAGES / name), default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    return at


def test_the_app_and_its_pages_render() -> None:
    page("main.py")
    plan = page("plan_page.py")
    assert "press Plan" in plan.info[0].value
    trace = page("trace_page.py")
    assert trace.metric[0].value == "200"
    explore = page("explore_page.py")
    assert len(explore.metric) == 5
    # The default engine (vLLM's, fitted on real runs) draws its 80 % intervals first.
    assert [c.key for c in explore.get("plotly_chart")] == ["intervals", "cdfs", "split", "scatter", "timeseries"]
    compare = page("compare_page.py")
    assert list(compare.dataframe[0].value.columns) == ["Figure", "Fleet A", "Fleet B"]
    listed = page("catalog_page.py")  # the rows `servecast catalog` prints
    models, hardware, engines = (frame.value for frame in listed.dataframe)
    assert "llama-3.1-8b" in set(models["model"]) and "$ / hour" in hardware.columns
    assert hardware.set_index("hardware").loc["h100-sxm", "costs"] == "validated on real serving runs"
    assert "vllm-v0.15" in set(engines["engine"]) and not hardware.isna().any().any()


def test_planning_recommends_a_fleet_and_the_hardware_changes_it() -> None:
    at = page("plan_page.py")
    at.number_input(key="plan_num").set_value(60)
    at.multiselect(key="quant").set_value(["bf16"])
    at.multiselect(key="tp").set_value([1])
    at.multiselect(key="hardware").set_value(["h100-sxm"])
    at.button[0].click().run()
    assert not at.exception and "h100-sxm bf16 tp=1" in at.success[0].value
    at.multiselect(key="hardware").set_value(["l40s"])
    at.button[0].click().run()
    assert "x l40s bf16 tp=1" in at.success[0].value
    assert [list(d.value.columns)[0] for d in at.dataframe] == ["SLO metric", "Deployment"]  # all fleets meet the SLOs
    assert len(at.get("download_button")) == 2
    # Growth and SLO sensitivity: the recommended cost never falls as traffic grows or SLOs tighten.
    at.multiselect(key="growth").set_value([1.0, 2.0])
    at.checkbox(key="slo_sensitivity").check()
    at.button[0].click().run()
    assert not at.exception and len(at.success) == 2
    figures = [json.loads(chart_spec(c)) for c in at.get("plotly_chart")]
    charts = {f["layout"]["title"]["text"]: f for f in figures}
    growth = charts["Sensitivity to traffic growth"]["data"][0]["y"]
    slo = charts["Sensitivity to SLO tightness"]["data"][0]
    assert growth[0] <= growth[1]
    by_scale = dict(zip(slo["x"], slo["y"]))  # tighter (0.5x) costs at least as much as looser (2x)
    assert by_scale[0.5] is None or by_scale[0.5] >= by_scale[1.0] >= by_scale[2.0]


def test_planning_a_mixture_of_experts_model_offers_expert_parallel_candidates() -> None:
    at = page("plan_page.py")
    at.selectbox[0].set_value("mixtral-8x7b")
    at.number_input(key="plan_num").set_value(40)
    at.multiselect(key="quant").set_value(["fp8"])
    at.multiselect(key="hardware").set_value(["h100-sxm"])
    at.multiselect(key="tp").set_value([1])
    at.multiselect(key="ep").set_value(["whole per rank (EP)"])
    at.button[0].click().run()
    assert not at.exception and "TP > 1" in at.warning[0].value  # EP over one rank is no choice
    at.multiselect(key="tp").set_value([2])
    at.multiselect(key="ep").set_value(["sliced (TP)", "whole per rank (EP)"])
    at.button[0].click().run()
    assert not at.exception
    labels = {d for frame in at.dataframe  # planned, whether or not a fleet of it meets the SLOs
              for cell in frame.value.get("Deployment", frame.value.get("Deployments", [])) for d in cell.split(", ")}
    assert {"h100-sxm fp8 tp=2", "h100-sxm fp8 tp=2 ep"} <= labels


def test_a_bad_trace_spec_shows_its_reason_and_nothing_crashes() -> None:
    at = page("plan_page.py")
    at.radio(key="plan_src").set_value("trace spec").run()
    at.text_input(key="plan_spec").set_value("synthetic:num=abc,input=10,output=10,rate=1").run()
    assert not at.exception and at.error and "num" in at.error[0].value


def test_explore_follows_the_fleet_and_refuses_one_that_cannot_hold_the_model() -> None:
    at = page("explore_page.py")
    at.number_input(key="explore_rate").set_value(16.0).run()
    one = at.metric[1].value  # TTFT p99 of one replica at twice the default rate
    at.number_input(key="explore_replicas").set_value(4).run()
    assert not at.exception and at.metric[1].value != one
    at.selectbox(key="explore_model").set_value("llama-3.1-405b").run()
    assert not at.exception and at.error and "weights" in at.error[0].value


def test_explore_says_what_a_cpu_kv_tier_served() -> None:
    at = page("explore_page.py")
    assert "CPU KV tier" not in at.caption[0].value
    at.number_input(key="explore_offload").set_value(128).run()
    assert not at.exception and "prompt tokens from the 128 GB CPU KV tier" in at.caption[0].value


def test_explore_runs_a_disaggregated_fleet_and_describes_its_pools() -> None:
    at = page("explore_page.py")
    at.number_input(key="explore_replicas").set_value(2).run()
    at.selectbox(key="explore_split").set_value("1:3").run()
    assert not at.exception and any("prefill pool 2 x h100-sxm" in c.value and "decode pool 6 x" in c.value
                                    for c in at.caption)


def test_concurrent_clients_load_a_fleet_in_closed_loop() -> None:
    at = page("explore_page.py")
    open_loop = at.metric[1].value
    at.radio(key="explore_load").set_value("concurrent clients").run()
    at.number_input(key="explore_clients").set_value(48).run()
    assert not at.exception and at.metric[1].value != open_loop
    trace = page("trace_page.py")
    trace.radio(key="trace_load").set_value("concurrent clients").run()
    assert not trace.exception and "closed-loop clients" in trace.caption[0].value


def test_compare_puts_two_fleets_side_by_side() -> None:
    at = page("compare_page.py")
    a_before, b_before = (at.dataframe[0].value[c].tolist() for c in ("Fleet A", "Fleet B"))
    at.selectbox(key="b_hw").set_value("l40s").run()
    assert not at.exception
    assert at.dataframe[0].value["Fleet B"].tolist() != b_before  # B changed hardware ...
    assert at.dataframe[0].value["Fleet A"].tolist() == a_before  # ... A did not


def test_the_trace_page_follows_the_rate() -> None:
    at = page("trace_page.py")
    at.number_input(key="trace_rate").set_value(20.0).run()
    assert not at.exception
    assert abs(float(at.metric[1].value) - 20.0) < 4.0  # a 200-request Poisson draw at 20 req/s


def test_uploads_are_validated_with_the_line_and_the_fix() -> None:
    good = workload_from_upload("lengths.csv", b"prompt_tokens,output_tokens\n10,20\n30,40\n5,6\n", rate=2.0)
    assert len(good) == 3
    with pytest.raises(WorkloadError, match=r"lengths\.csv:3: prompt_tokens must be a whole number") as bad:
        workload_from_upload("lengths.csv", b"prompt_tokens,output_tokens\n10,20\nabc,40\n", rate=2.0)
    assert "/tmp" not in str(bad.value)  # named as uploaded, not by its temporary copy
    with pytest.raises(WorkloadError, match="upload a .csv"):
        workload_from_upload("trace.parquet", b"x", rate=1.0)
    with pytest.raises(WorkloadError, match="limit"):
        workload_from_upload("big.csv", b"x" * (MAX_UPLOAD_BYTES + 1), rate=1.0)
    with pytest.raises(WorkloadError, match="empty"):
        workload_from_upload("empty.csv", b"\n", rate=1.0)


def test_calibration_lists_profiles_and_says_where_predictions_come_from(tmp_path, monkeypatch) -> None:
    folder = tmp_path / ".cache" / "servecast"
    folder.mkdir(parents=True)
    header = {"format": "servecast-profile", "version": 1, "hardware": "cpu-local",
              "fingerprint": {"device_name": "test cpu", "dtype": "fp32", "threads": 1},
              "peaks": {"matmul_flops": 1e11, "memory_bandwidth": 1e10}, "source": "test"}
    point = {"op": "gemm", "m": 8, "n": 64, "k": 64, "dtype": "fp32", "time_s": 1e-5, "name": "qkv_proj"}
    (folder / "mine.jsonl").write_text(json.dumps(header) + "\n" + json.dumps(point) + "\n")
    (folder / "notes.jsonl").write_text("not a profile\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    at = page("calibration_page.py")
    listed = at.dataframe[0].value
    mine = listed[listed["Profile file"] == str(folder / "mine.jsonl")]
    assert mine["Measurements"].tolist() == [1]  # and notes.jsonl, not a profile, is not listed
    shipped = listed[listed["Profile file"].str.startswith(str(SHIPPED_PROFILES))]
    assert len(listed) == 1 + len(shipped) and "h200" in set(shipped["Accelerator"])  # the project's GPU profile
    provenance = at.dataframe[1].value
    assert set(provenance["Source"]) <= {"fitted", "extrapolated"}  # a catalog GPU without a profile
    assert not any(frame.isna().any().any() for frame in (listed, provenance))  # shown as None otherwise
    at.selectbox(key="cal_hw").set_value("cpu-local").run()
    assert "pass its profile" in at.error[0].value
    at.text_input(key="cal_profile").set_value(str(tmp_path / "missing.jsonl")).run()
    assert "no profile at" in at.error[0].value
    at.text_input(key="cal_validate").set_value(str(tmp_path)).run()
    assert any("no errors.csv" in e.value for e in at.error) and not at.exception


def test_a_repeated_question_is_answered_from_the_store_without_simulating(monkeypatch) -> None:
    """Going back to an earlier fleet answers at once: the simulation runs once per question."""
    import simulator.fleet.run

    calls = []
    simulate = simulator.fleet.run.simulate
    monkeypatch.setattr(simulator.fleet.run, "simulate", lambda *a, **k: calls.append(1) or simulate(*a, **k))
    at = page("explore_page.py")
    at.number_input(key="explore_rate").set_value(3.0).run()
    first = at.metric[1].value
    asked = len(calls)
    at.number_input(key="explore_replicas").set_value(3).run()
    assert len(calls) == asked + 1
    at.number_input(key="explore_replicas").set_value(1).run()  # the earlier question again
    assert not at.exception and len(calls) == asked + 1 and at.metric[1].value == first
