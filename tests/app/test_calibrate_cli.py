"""`servecast calibrate` writes where it is told and leaves the installed catalog file alone unless
--update-catalog. The real fit takes minutes, so these tests fake the fitting and keep the file
handling (and, with ../shared, everything but the per-curve least squares) real."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import calibrate.fitting.curve as fit
from app.cli import app
from simulator.cost.efficiency import EfficiencyCurve

runner = CliRunner()
SHARED = Path(__file__).resolve().parents[2].parent / "shared"
CATALOG = Path(__file__).resolve().parents[2] / "simulator" / "catalog" / "efficiency.json"
FAKE = {"held_out_a40_mape": {"qkv_proj": 0.1}, "curves": {}}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def fake_fit(monkeypatch):
    """build_params replaced by one that reports two steps and writes FAKE where it is told."""
    calls = []

    def build_params(shared, out, progress=None):
        for done in range(2):
            progress(f"step {done}", done, 2)
        progress("done", 2, 2)
        calls.append(Path(out))
        fit.write_params(out, FAKE)
        return FAKE

    monkeypatch.setattr(fit, "build_params", build_params)
    return calls


def test_default_writes_efficiency_json_here_and_not_the_catalog(fake_fit, tmp_path, monkeypatch) -> None:
    before = digest(CATALOG)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["calibrate"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "efficiency.json").read_text()) == FAKE
    assert str((tmp_path / "efficiency.json").resolve()) in result.stdout.replace("\n", "")
    assert "--update-catalog" in result.stdout and digest(CATALOG) == before
    out = tmp_path / "mine.json"
    assert runner.invoke(app, ["calibrate", "--out", str(out)]).exit_code == 0
    assert json.loads(out.read_text()) == FAKE and digest(CATALOG) == before


def test_update_catalog_writes_the_catalog_file(fake_fit, tmp_path, monkeypatch) -> None:
    installed = tmp_path / "catalog-efficiency.json"
    monkeypatch.setattr(fit, "PARAMS_OUT", installed)
    result = runner.invoke(app, ["calibrate", "--update-catalog"])
    assert result.exit_code == 0, result.output
    assert fake_fit == [installed] and json.loads(installed.read_text()) == FAKE


@pytest.mark.parametrize("args, message", [
    (["--update-catalog", "--out", "x.json"], "not both"),
    (["--out", "no/such/folder/e.json"], "does not exist"),
    (["--out", "."], "is a folder"),
    (["--update-catalog", "--runs", "runs.md"], "does not apply to --runs"),
])
def test_bad_targets_fail_before_fitting(fake_fit, tmp_path, monkeypatch, args, message) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["calibrate", *args])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
    assert fake_fit == []


def test_the_real_fit_reports_every_curve_and_writes_out(tmp_path, monkeypatch) -> None:
    if not (SHARED / "profiles" / "vidur").is_dir():
        pytest.skip("../shared/profiles/vidur is not beside the checkout")
    shipped = json.loads(CATALOG.read_text())["curves"]["gemm"]
    monkeypatch.setattr(fit, "fit_curve", lambda *a, **k: EfficiencyCurve.from_dict(shipped))
    steps = []
    before = digest(CATALOG)
    out = tmp_path / "efficiency.json"
    params = fit.build_params(SHARED, out, progress=lambda *step: steps.append(step))
    assert json.loads(out.read_text()) == params and digest(CATALOG) == before
    curves = [label for label, _, _ in steps if label.startswith("curve ")]
    assert sorted(curves) == sorted(f"curve {key}" for key in params["curves"])
    assert [done for _, done, _ in steps] == list(range(len(steps)))
    assert {total for _, _, total in steps} == {len(steps) - 1}
