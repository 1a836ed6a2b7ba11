"""servecast train-pair / acceptance on a tiny corpus and budget (the real pair trains for minutes)."""

from __future__ import annotations

import inspect
import json

from typer.testing import CliRunner

import engine.policy.scheduler
import engine.policy.block_manager
import engine.sampler
from app.cli import app
from calibrate.fitting.spec_pair import corpus_files, split_corpus

runner = CliRunner()


def _corpus(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for module in (engine.policy.scheduler, engine.policy.block_manager, engine.sampler):
        (corpus / f"{module.__name__.split('.')[-1]}.py").write_text(inspect.getsource(module))
    return corpus


def test_corpus_split_holds_out_whole_files(tmp_path) -> None:
    files = corpus_files(_corpus(tmp_path))
    train, heldout = split_corpus(files, heldout_every=20)
    assert heldout == files[-1].read_bytes() and files[-1].read_bytes() not in train


def test_train_pair_saves_a_pair_and_measures_acceptance(tmp_path) -> None:
    out = tmp_path / "pair"
    result = runner.invoke(app, ["train-pair", "--out", str(out), "--target-seconds", "1", "--draft-seconds", "1",
                                 "--corpus", str(_corpus(tmp_path))])
    assert result.exit_code == 0, result.output
    for path in ("target/config.json", "draft/config.json", "heldout.bin", "pair.json", "acceptance.json"):
        assert (out / path).exists(), path
    stats = json.loads((out / "acceptance.json").read_text())
    assert len(stats["acceptance_by_position"]) == 4 and all(0 <= a <= 1 for a in stats["acceptance_by_position"])
    again = runner.invoke(app, ["acceptance", "--pair", str(out), "--gamma", "2", "--num-prompts", "2",
                                "--output-bytes", "8", "--json"])
    assert again.exit_code == 0, again.output
    assert len(json.loads(again.stdout)["acceptance_by_position"]) == 2


def test_acceptance_without_a_pair_fails_cleanly(tmp_path) -> None:
    result = runner.invoke(app, ["acceptance", "--pair", str(tmp_path / "none")])
    assert result.exit_code == 2 and "train-pair" in result.output and "Traceback" not in result.output


def test_acceptance_with_no_prompts_fails_cleanly(tmp_path) -> None:
    (tmp_path / "pair.json").write_text("{}")
    result = runner.invoke(app, ["acceptance", "--pair", str(tmp_path), "--num-prompts", "0"])
    assert result.exit_code == 2 and "at least 1" in result.output and "Traceback" not in result.output
