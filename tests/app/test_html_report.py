"""Report charts: a CDF drawn from a subset of its points still lies exactly on the CDF."""

from __future__ import annotations

import numpy as np

from app.html_report import cdf_points


def test_cdf_points_keep_few_values_and_thin_many_onto_the_cdf() -> None:
    few = np.array([0.1, 0.2, 0.2, 0.5])
    x, y = cdf_points(few)
    assert x.tolist() == few.tolist() and y.tolist() == [0.25, 0.5, 0.75, 1.0]
    many = np.sort(np.random.default_rng(0).lognormal(size=10_007))
    x, y = cdf_points(many, most=500)
    assert len(x) == 500 and x[0] == many[0] and x[-1] == many[-1] and y[-1] == 1.0
    # Each point is a point of the empirical CDF: the share of values at or below it.
    assert np.array_equal(y, np.searchsorted(many, x, side="right") / len(many))
    assert np.all(np.diff(x) > 0)  # evenly spread ranks, none twice


def test_the_simulation_report_reads_as_words_and_labelled_charts(tmp_path) -> None:
    from app.html_report import summary_rows, time_split_figure, timeseries_figure
    from simulator.fleet.run import simulate
    from simulator.fleet.sim_config import SimConfig
    from simulator.workload.load import load_workload

    workload = load_workload("synthetic:num=60,input=uniform(100,600),output=uniform(10,80),rate=20")
    one = simulate(SimConfig(model="llama-3.1-8b", hardware="h100-sxm", slo={"ttft_p99": 1.0}), workload)
    rows = dict(summary_rows(one.summary))
    assert rows["requests"].startswith("60 of 60 finished") and "limit 1,000.0 ms" in rows["SLOs"]
    assert any(k.endswith("predicted") and "80 % interval" in v for k, v in rows.items())
    # One replica: no legend of five "replica 0"s; every panel has its axis title.
    lone = timeseries_figure(one.timeseries)
    assert not lone.layout.showlegend and all(not t.showlegend for t in lone.data)
    assert lone.layout.yaxis.title.text == "queue length"
    two = simulate(SimConfig(model="llama-3.1-8b", hardware="h100-sxm", replicas=2), workload)
    legend = [t.name for t in timeseries_figure(two.timeseries).data if t.showlegend]
    assert legend == ["replica 0", "replica 1"]
    split = time_split_figure(one.summary)
    assert split.layout.xaxis.title.text and split.layout.yaxis.title.text == "mean seconds"
    from app.html_report import simulation_report

    simulation_report(tmp_path / "report.html", one)
    text = (tmp_path / "report.html").read_text()
    assert "<pre>" not in text and "summary.json" in text and "60 of 60 finished" in text


def test_the_plan_report_marks_the_front_rather_than_drawing_it_on_other_metrics() -> None:
    from app.plan_report import cost_latency_figure

    rows = [{"candidate": c, "feasible": True, "usd_per_hour": usd, "replicas": 1, "ttft_p99_s": t, "tpot_p99_s": 0.02,
             "hardware": "h100-sxm", "quant": "bf16", "tp": 1, "pp": 1, "cp": 1,
             "intervals": {}} for c, usd, t in (("a", 1.0, 0.5), ("b", 2.0, 0.2), ("c", 3.0, 0.3))]
    fig = cost_latency_figure(rows, ["a", "b"], {"ttft_p99": 1.0, "tpot_p99": 0.1}, 1.0)
    front = [t for t in fig.data if "Pareto" in (t.name or "")]
    assert front and all(t.mode == "markers" for t in front) and "E2E p99" in front[0].name
