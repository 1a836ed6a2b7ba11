"""CSV trace files with '#' comment lines, and the error for columns no reader knows."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from app.cli import app
from simulator.workload.load import load_workload
from simulator.workload.requests import BUNDLED_LENGTHS, WorkloadError, load_length_pairs


def test_the_bundled_lengths_file_opens_with_a_comment_and_loads_with_a_rate() -> None:
    assert BUNDLED_LENGTHS.read_text().startswith("#")
    w = load_workload(f"{BUNDLED_LENGTHS},rate=8")
    assert len(w) == 2000 and w.rate_per_s == pytest.approx(8, rel=0.1)
    assert (w.requests[0].prompt_tokens, w.requests[0].output_tokens) == (775, 777)
    assert len(load_length_pairs(BUNDLED_LENGTHS)) == 2000


def test_comment_lines_anywhere_are_skipped_and_line_numbers_stay_the_files(tmp_path) -> None:
    f = tmp_path / "vidur.csv"
    f.write_text("# made by hand\n#second comment\narrived_at,num_prefill_tokens,num_decode_tokens\n"
                 "0,10,5\n# between rows\n1.5,20,6\n2,x,7\n")
    with pytest.raises(WorkloadError, match=r"vidur\.csv:7: num_prefill_tokens"):
        load_workload(str(f))
    f.write_text(f.read_text().replace("2,x,7\n", ""))
    assert [(r.arrival_s, r.prompt_tokens) for r in load_workload(str(f))] == [(0.0, 10), (1.5, 20)]


def test_a_hash_inside_a_field_is_data_not_a_comment(tmp_path) -> None:
    f = tmp_path / "lengths.csv"
    f.write_text('prompt_tokens,output_tokens,note\n10,5,"two\n# lines"\n20,6,x#y\n')
    pairs = load_length_pairs(f)
    assert [(p.prompt_tokens, p.output_tokens) for p in pairs] == [(10, 5), (20, 6)]
    assert len(load_workload(f"{f},rate=1")) == 2


def test_unknown_columns_list_every_accepted_set(tmp_path) -> None:
    f = tmp_path / "odd.csv"
    f.write_text("# comment\nwhen,prompt\n1,2\n")
    with pytest.raises(WorkloadError) as err:
        load_workload(f"{f},rate=1")
    message = str(err.value)
    assert "['prompt', 'when']" in message
    for columns in ("TIMESTAMP,ContextTokens,GeneratedTokens", "arrived_at,num_prefill_tokens,num_decode_tokens",
                    "num_prefill_tokens,num_decode_tokens", "prompt_tokens,output_tokens"):
        assert columns in message


def test_cli_simulates_the_bundled_file_with_a_rate() -> None:
    result = CliRunner().invoke(app, ["simulate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm",
                                      "--trace", f"{BUNDLED_LENGTHS},rate=8,num=40"])
    assert result.exit_code == 0, result.output
    assert "40/40 requests finished" in result.stdout
