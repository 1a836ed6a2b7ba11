"""`servecast ablate`: the technique ladder as a table and as JSON; bad input exits 2 with the reason."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from app.cli import app

runner = CliRunner()
SMALL = ["ablate", "--model", "llama-3.1-8b", "--hardware", "a100-80gb",
         "--workload", "synthetic:num=60,input=uniform(100,800),output=uniform(20,200),rate=4,prefixes=2,prefix_len=200"]


def test_ablate_prints_every_rung_and_its_json_agrees() -> None:
    out = json.loads(runner.invoke(app, [*SMALL, "--json"]).stdout)
    assert out["max_model_len"] == 2048  # the longest request (a 200-token prefix, 800 more, 200 out) rounded up
    assert [row["technique"] for row in out["rows"]][0] == "static batching" and len(out["rows"]) == 9
    assert all(row["feasible"] and row["gpus"] >= 1 for row in out["rows"])
    table = runner.invoke(app, SMALL, env={"COLUMNS": "200"})
    assert table.exit_code == 0
    for row in out["rows"]:
        assert row["technique"] in table.stdout


def test_bad_input_exits_2_with_the_reason() -> None:
    unknown = runner.invoke(app, ["ablate", "--model", "no-such-model"])
    assert unknown.exit_code == 2 and "no-such-model" in unknown.output
    hardware = runner.invoke(app, ["ablate", "--hardware", "no-such-gpu"])
    assert hardware.exit_code == 2 and "unknown hardware 'no-such-gpu'" in hardware.output
    spec = runner.invoke(app, [*SMALL, "--speculative", "medusa"])
    assert spec.exit_code == 2 and "ngram or draft" in spec.output
