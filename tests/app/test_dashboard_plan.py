"""The Plan page asks `servecast plan`'s question unless told otherwise (app/plan_defaults.py), says
it in words and units, and shows the answer under human labels, never as None."""

from __future__ import annotations

import json

from app import labels, plan_defaults, plan_words
from simulator.fleet.sim_config import parse_slos
from tests.app.test_dashboard import chart_spec, page, table


def question_shown(at) -> str:
    return next(m.value for m in at.markdown if m.value.startswith("**The question:**"))


def test_the_plan_page_asks_the_cli_question_by_default() -> None:
    at = page("plan_page.py")
    assert at.selectbox[0].value == plan_defaults.MODEL
    assert at.radio(key="plan_src").value == "bundled ShareGPT lengths"
    assert at.number_input(key="plan_num").value == plan_defaults.NUM_REQUESTS
    assert at.number_input(key="plan_rate").value == plan_defaults.RATE
    slo = parse_slos(plan_defaults.SLO)  # the CLI's --slo default, read as the CLI reads it
    assert slo == plan_defaults.slo_values()
    assert at.number_input(key="ttft").value == slo["ttft_p99"]
    assert abs(at.number_input(key="tpot").value - slo["tpot_p99"] * 1e3) < 1e-9
    assert at.multiselect(key="hardware").value == plan_defaults.priced_gpus()
    assert at.multiselect(key="quant").value == list(plan_defaults.QUANT)
    assert at.multiselect(key="tp").value == list(plan_defaults.TP)
    assert at.multiselect(key="growth").value == list(plan_defaults.GROWTH)
    asked = question_shown(at)
    assert (f"serving {plan_defaults.MODEL} for {plan_defaults.NUM_REQUESTS} requests at {plan_defaults.RATE:g} req/s "
            "(ShareGPT lengths) with TTFT p99 ≤ 2 s and TPOT p99 ≤ 100 ms") in asked
    assert all(g in asked for g in plan_defaults.priced_gpus()) and "TP 1, 2, 4 or 8" in asked


def test_the_plan_is_shown_in_labels_and_units_with_reasons_grouped_and_no_none() -> None:
    at = page("plan_page.py")
    at.number_input(key="plan_num").set_value(40)
    at.multiselect(key="hardware").set_value(["a100-40gb", "a100-80gb", "h100-sxm"])
    at.multiselect(key="quant").set_value(["fp8"])  # the A100s have no fp8: one reason, two accelerators
    at.multiselect(key="tp").set_value([1])
    at.button[0].click().run()
    assert not at.exception
    assert "for 40 requests at 8 req/s" in question_shown(at) and "(fp8 weights, TP 1)" in question_shown(at)
    assert "Recommended: 1 x h100-sxm fp8 tp=1" in at.success[0].value
    assert not at.warning  # on validated costs (h100-sxm): no caveat
    for frame in at.dataframe:  # every table: no empty cell (Streamlit writes None there), no "None"
        cells = frame.value.astype(str)
        assert not frame.value.isna().any().any() and not cells.isin(["None", "nan"]).any().any()
    feasible = table(at, "Deployment")
    shown = [labels.label(f) for f in ("candidate", "replicas", "gpus", "usd_per_hour", "ttft_p99_s", "tpot_p99_s")]
    assert list(feasible.columns)[:4] == shown[:4] and set(shown) <= set(feasible.columns)
    assert feasible["Deployment"].tolist() == ["h100-sxm fp8 tp=1"]
    row = feasible.iloc[0]
    reasons = table(at, "Why not")
    assert list(reasons.columns) == ["Why not", "How many", "Deployments"]
    assert reasons["How many"].tolist() == [2] and "no fp8 tensor cores" in reasons["Why not"][0]
    assert reasons["Why not"][0].startswith("a100-40gb or a100-80gb has no fp8")  # named, not "the accelerator"
    assert reasons["Deployments"][0] == "a100-40gb fp8 tp=1, a100-80gb fp8 tp=1"
    # The recommended fleet's SLOs (plan_words.slo_rows, as the report and terminal show them).
    latency = table(at, "SLO metric").set_index("SLO metric")
    assert list(latency.columns) == ["predicted", "80 % interval", "limit", "met"]
    assert latency.loc["TTFT p99", "predicted"] == plan_words.slo_value("ttft_p99", row["TTFT p99 (ms)"] / 1e3)
    assert latency.loc["TTFT p99", "limit"] == "2 s" and latency.loc["TPOT p99", "limit"] == "100 ms"
    assert " – " in latency.loc["TTFT p99", "80 % interval"] and set(latency["met"]) == {"yes"}
    assert any("at the slow end of the 80 % interval" in c.value for c in at.caption)
    figures = {c.key: json.loads(chart_spec(c)) for c in at.get("plotly_chart")}
    assert set(figures) == {"intervals_1.0", "pareto_1.0"}
    assert all(t.get("name") and (t.get("hovertemplate") or t.get("text")) for f in figures.values() for t in f["data"])


def test_a_table_keeps_numbers_in_the_label_units_and_writes_a_dash_where_one_is_missing() -> None:
    from app.dashboard.tables import frame, readable
    import pandas as pd

    rows = [{"candidate": "a", "ttft_p99_s": 0.25, "headroom": 1.5, "replicas_slow_end": None},
            {"candidate": "b", "ttft_p99_s": 0.5, "headroom": None, "replicas_slow_end": None}]
    table, config = frame(rows, ["candidate", "ttft_p99_s", "headroom", "replicas_slow_end"])
    assert list(table.columns) == ["Deployment", "TTFT p99 (ms)", "Headroom (x traffic)"]  # none anywhere: left out
    assert table["TTFT p99 (ms)"].tolist() == [250.0, 500.0] and "TTFT p99 (ms)" in config  # numbers, in ms
    assert table["Headroom (x traffic)"].tolist() == ["x1.50", "–"]
    shown = readable(pd.DataFrame({"threads": [8, None], "dtype": ["fp32", None]}))
    assert shown.to_dict("list") == {"threads": ["8", "–"], "dtype": ["fp32", "–"]}


def test_the_plan_page_says_when_the_answer_rests_on_unvalidated_costs() -> None:
    at = page("plan_page.py")
    at.number_input(key="plan_num").set_value(40)
    at.multiselect(key="hardware").set_value(["mi300x", "h100-sxm"])
    at.multiselect(key="quant").set_value(["fp8"])
    at.multiselect(key="tp").set_value([1])
    at.button[0].click().run()
    assert not at.exception and "Recommended: 1 x mi300x fp8 tp=1" in at.success[0].value
    assert "unvalidated costs" in at.warning[0].value and "h100-sxm fp8 tp=1" in at.warning[0].value
