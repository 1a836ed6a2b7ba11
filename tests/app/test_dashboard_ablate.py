"""The Ablate page: the ladder `servecast ablate` prints, its chart, and bad input shown, not raised."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

PAGE = Path(__file__).resolve().parents[2] / "app" / "dashboard" / "ablate_page.py"
SMALL = "synthetic:num=60,input=uniform(100,800),output=uniform(20,200),rate=4,prefixes=2,prefix_len=200"


def test_the_page_waits_then_shows_the_ladder_for_what_is_chosen() -> None:
    at = AppTest.from_file(str(PAGE), default_timeout=180)
    at.run()
    assert not at.exception and "press Ablate" in at.info[0].value
    at.selectbox(key="ablate_model").set_value("llama-3.1-8b")
    at.text_input(key="ablate_workload").set_value(SMALL)
    at.button(key="ablate_go").click()
    at.run()
    assert not at.exception, at.exception
    frame = at.dataframe[0].value
    assert list(frame["Technique"])[:3] == ["static batching", "continuous batching", "paged KV"]
    assert (frame["GPUs"] >= 1).all() and len(frame) == 9
    assert [c.key for c in at.get("plotly_chart")] == ["ablate_gpus"]


def test_a_bad_workload_shows_its_reason() -> None:
    at = AppTest.from_file(str(PAGE), default_timeout=60)
    at.run()
    at.text_input(key="ablate_workload").set_value("synthetic:num=oops")
    at.button(key="ablate_go").click()
    at.run()
    assert not at.exception and at.error and "num" in at.error[0].value
