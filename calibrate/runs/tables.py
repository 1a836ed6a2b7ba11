"""Real serving runs to replay: summaries of measured runs (model, GPU, TP, engine flags, workload,
measured latencies) read from markdown or CSV tables in the shape of ../shared/reference/vllm-runs.md.
No torch.

A run's workload is an inference-perf shared-prefix preset (N system prompts x M users, each user
sending one fixed prompt, constant-rate stages, forced output lengths: simulator/workload/synthetic.py
builds it from `RealRun.spec`). Presets come from a table with a `Workload` and a `Stages` column
(the runs file's own preset table); a run's own observed prompt mean replaces the preset's where
its table has it. Requests generate the preset's forced output (ignore_eos with max_tokens makes
vLLM generate exactly that many); the measured output mean -- the table's, or what its derived TPOT
implies -- is only the divisor of the derived TPOT, as in the runs file, since the client counts
the streamed text's tokens and can count fewer (docs/fidelity.md).
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from simulator.catalog.models import MODELS_DIR
from simulator.fleet.sim_config import SimConfig
from simulator.workload.load import load_workload
from simulator.workload.requests import Workload

# What the tables' cells name, in milliseconds (TPOT: the derived one, see vllm-runs.md caveat 1).
METRICS = ("e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99", "tpot")
_COLUMNS = {"e2e_mean": "e2e mean", "e2e_p90": "e2e p90", "e2e_p99": "e2e p99", "ttft_mean": "ttft mean",
            "ttft_p90": "ttft p90", "ttft_p99": "ttft p99"}
_TPOT_COLUMNS = ("derived tpot", "tpot mean", "tpot")
# A measured TTFT mean above this is a run the server could not keep up with (queues of minutes).
SATURATED_TTFT_MS = 10_000.0
# The campaign's fixed server flags (../shared/reference/vllm-runs.md, Protocol).
MAX_NUM_SEQS, BLOCK_SIZE, MAX_MODEL_LEN = 128, 16, 4096


class RunsError(ValueError):
    """A runs table that cannot be used; the message names the file, row and fix."""


@dataclass(frozen=True)
class Preset:
    name: str
    stages: tuple[tuple[float, float], ...]  # (requests/s, seconds), back to back
    prefixes: int
    users: int
    prefix_len: int
    question_len: int
    output_len: int
    prompt_mean: float | None  # observed prompt length (system + question + template), if known


@dataclass(frozen=True)
class RealRun:
    id: str
    model: str  # catalog id or config.json path
    hardware: str
    tp: int
    quant: str
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    preset: Preset
    measured: dict[str, float]  # METRICS present in the table, ms
    prompt_mean: float  # tokens per prompt, template included
    output_tokens: int  # what every request was made to generate (the preset's forced output_len)
    output_mean: float  # output tokens per request: the table's mean, else what its derived TPOT implies
    kv_offload: bool = False
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    @property
    def saturated(self) -> bool:
        return self.measured.get("ttft_mean", 0.0) > SATURATED_TTFT_MS

    def spec(self, time_scale: float = 1.0) -> str:
        """The run's workload as a synthetic spec; time_scale < 1 shortens every stage alike."""
        p = self.preset
        stages = "+".join(f"{rate:g}x{seconds * time_scale:g}" for rate, seconds in p.stages)
        question = max(1, round(self.prompt_mean - p.prefix_len))
        return (f"synthetic:prefixes={p.prefixes},users={p.users},prefix_len={p.prefix_len},input={question},"
                f"output={self.output_tokens},arrival=constant,stages={stages}")

    @property
    def family(self) -> str:
        """The model's catalog id, for leave-one-model-out."""
        return model_family(self.model)

    # -- what a measured run offers the fit (calibrate/runs/measured.py MeasuredRun) ----------------
    @property
    def duration_s(self) -> float:
        return sum(seconds for _, seconds in self.preset.stages)

    def sim_config(self) -> SimConfig:
        return SimConfig(model=self.model, hardware=self.hardware, tp=self.tp, quant=self.quant,
                         max_num_batched_tokens=self.max_num_batched_tokens, max_num_seqs=MAX_NUM_SEQS,
                         block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN,
                         gpu_memory_utilization=self.gpu_memory_utilization)

    def workload(self, time_scale: float = 1.0) -> Workload:
        return load_workload(self.spec(time_scale))

    def figures(self, summary) -> dict[str, float]:
        """METRICS of a simulation's summary in ms, TPOT derived as the runs file derives it:
        (E2E mean - TTFT mean) / (measured output mean - 1)."""
        figures = summary_figures(summary)
        figures["tpot"] = (figures["e2e_mean"] - figures["ttft_mean"]) / max(self.output_mean - 1.0, 1.0)
        return figures


def model_family(model: str) -> str:
    """A model's name for leave-one-model-out: its catalog id, or its config file's stem."""
    name = Path(model)
    if name.name == "config.json":
        return name.parent.name
    return name.stem if model.endswith(".json") else model


def summary_figures(summary) -> dict[str, float]:
    """The E2E and TTFT METRICS of a summary (a simulation's or a replay's), in ms."""
    return {f"{metric}_{stat}": milliseconds(getattr(getattr(summary, f"{metric}_s"), stat))
            for metric in ("e2e", "ttft") for stat in ("mean", "p90", "p99")}


def milliseconds(seconds: float | None) -> float:
    """A summary's time in ms; nan where it has none (JSON null)."""
    return math.nan if seconds is None else seconds * 1e3


# -- table parsing ------------------------------------------------------------------------------
def _number(text: str) -> float | None:
    """'5,270' -> 5270; '≈571–575' -> 573 (a range's midpoint); '' / 'n/a' / '–' -> None."""
    values = [float(v.replace(",", "")) for v in re.findall(r"\d[\d,]*\.?\d*", text)]
    if not values or text.strip() in ("", "–", "-", "n/a"):
        return None
    return sum(values[:2]) / len(values[:2]) if re.search(r"\d\s*[–-]\s*\d", text) else values[0]


def _stages(text: str) -> tuple[tuple[float, float], ...]:
    found = re.findall(r"(\d+\.?\d*)\s*[×x]\s*(\d+\.?\d*)\s*s?", text)
    if not found:
        raise RunsError(f"stages {text!r}: write RATExSECONDS stages, e.g. 8×600s → 20×600s")
    return tuple((float(r), float(s)) for r, s in found)


def markdown_tables(text: str) -> list[list[dict[str, str]]]:
    """Every pipe table of a markdown text, as rows keyed by lower-cased header."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|[\s:|-]+\|\s*$", lines[i + 1]):
            header = [h.strip().lower() for h in lines[i].strip().strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                cells = [c.strip().strip("`") for c in lines[i].strip().strip("|").split("|")]
                rows.append(dict(zip(header, cells)))
                i += 1
            tables.append(rows)
        else:
            i += 1
    return tables


def _cell(row: dict[str, str], *names: str) -> str | None:
    for name in names:
        for key, value in row.items():
            if key == name or key.startswith(name + " "):
                return value
    return None


def read_presets(rows: list[dict[str, str]]) -> dict[str, Preset]:
    presets = {}
    for row in rows:
        name = row["workload"].strip()
        pu = re.findall(r"\d+", _cell(row, "system prompts × users", "system prompts x users") or "")
        presets[name] = Preset(name, _stages(_cell(row, "stages") or ""), int(pu[0]), int(pu[1]),
                               int(_number(_cell(row, "system-prompt tokens") or "") or 0),
                               int(_number(_cell(row, "question tokens") or "") or 0),
                               int(_number(_cell(row, "output tokens") or "") or 0),
                               _number(_cell(row, "observed prompt_len mean") or ""))
    for name, p in list(presets.items()):  # "-lite" presets: the base preset's observed prompt length
        base = presets.get(name.removesuffix("-lite"))
        if p.prompt_mean is None and base is not None and base.prompt_mean is not None:
            presets[name] = replace(p, prompt_mean=base.prompt_mean)
    return presets


def catalog_model(name: str) -> str:
    """The catalog id of an HF model id (e.g. meta-llama/Llama-3.1-8B-Instruct -> llama-3.1-8b),
    or `name` itself when it is a catalog id or a config.json path."""
    if (MODELS_DIR / f"{name}.json").is_file() or name.endswith(".json"):
        return name

    def normal(hf_id: str) -> str:
        words = hf_id.split(" (")[0].split("/")[-1].lower().split("-")
        return "-".join(w for w in words if w not in ("instruct", "hf", "base", "fp8", "dynamic", "v0.1"))
    wanted = normal(name)
    for path in sorted(MODELS_DIR.glob("*.json")):
        hf_id = json.loads(path.read_text()).get("_hf_id")
        if wanted and hf_id and normal(hf_id) == wanted:  # entries without an HF id (the demo) match nothing
            return path.stem
    raise RunsError(f"model {name!r} is not in the catalog: name a catalog id or a config.json path")


def read_runs(path: str | Path, hardware: str = "h100-sxm", max_num_batched_tokens: int = 2048,
              presets: dict[str, Preset] | None = None) -> list[RealRun]:
    """Runs from a markdown file (pipe tables) or a CSV, with the workload presets found in the same
    file unless given. Columns it reads: ID or Folder, HF model (or Model), TP, Workload, E2E/TTFT
    mean/p90/p99, TPOT (derived), and where present Hardware, Prec, mbt, gpu-mem, KV offload,
    prompt len mean, output len mean. A run without mbt takes max_num_batched_tokens, without a
    hardware column `hardware`. Rows of one folder given twice keep the later one."""
    path = Path(path)
    if not path.is_file():
        raise RunsError(f"{path}: no such runs file; point --runs at a markdown or CSV table of run summaries")
    text = path.read_text()
    tables = markdown_tables(text) if path.suffix != ".csv" else [list(csv.DictReader(
        text.splitlines()))]
    tables = [[{k.strip().lower(): (v or "").strip() for k, v in row.items()} for row in t] for t in tables]
    presets = dict(presets or {})
    for table in tables:
        if table and "workload" in table[0] and _cell(table[0], "stages") is not None \
                and _cell(table[0], "e2e mean") is None:
            presets.update(read_presets(table))
    runs: dict[str, RealRun] = {}
    for number, table in enumerate(tables):
        if not table or _cell(table[0], "e2e mean") is None:
            continue
        for line, row in enumerate(table, 1):
            run = _run(row, f"{path.name} table {number + 1} row {line}", presets, hardware, max_num_batched_tokens)
            runs[(_cell(row, "folder") or run.id)] = run
    if not runs:
        raise RunsError(f"{path}: no table with an 'E2E mean' column: see ../shared/reference/vllm-runs.md's tables")
    return list(runs.values())


def _run(row: dict[str, str], where: str, presets: dict[str, Preset], hardware: str, mbt: int) -> RealRun:
    model = _cell(row, "hf model", "model")
    workload = _cell(row, "workload")
    tp = _number(_cell(row, "tp") or "")
    if not model or not workload or tp is None:
        raise RunsError(f"{where}: a run needs its model, TP and workload")
    if workload not in presets:
        raise RunsError(f"{where}: workload {workload!r} has no preset (known: {', '.join(presets) or 'none'}); "
                        "add a preset table with Workload and Stages columns")
    preset = presets[workload]
    measured = {m: v for m, col in _COLUMNS.items() if (v := _number(_cell(row, col) or "")) is not None}
    tpot = next((v for col in _TPOT_COLUMNS if (v := _number(_cell(row, col) or "")) is not None), None)
    if tpot is not None:
        measured["tpot"] = tpot
    if "e2e_mean" not in measured or "ttft_mean" not in measured:
        raise RunsError(f"{where}: a run needs its measured E2E and TTFT means")
    prompt_mean = _number(_cell(row, "prompt len mean") or "") or preset.prompt_mean \
        or preset.prefix_len + preset.question_len
    output_mean = _number(_cell(row, "output len mean") or "")
    if output_mean is None and "tpot" in measured:  # the derived TPOT's own definition gives it back
        output_mean = (measured["e2e_mean"] - measured["ttft_mean"]) / measured["tpot"] + 1.0
    output_mean = output_mean or preset.output_len
    gpu_mem = _cell(row, "gpu-mem") or "0.9"
    run_at = re.search(r"run at (\d\.\d+)", gpu_mem)  # the manifest's notes override its value
    precision = (_cell(row, "prec") or "").lower()
    return RealRun(
        id=_cell(row, "id") or _cell(row, "folder") or where, model=catalog_model(model),
        hardware=_cell(row, "hardware") or hardware, tp=int(tp), quant="fp8" if "fp8" in precision else "bf16",
        max_num_batched_tokens=int(_number(_cell(row, "mbt") or "") or mbt),
        gpu_memory_utilization=float(run_at.group(1)) if run_at else float(_number(gpu_mem) or 0.9),
        preset=preset, measured=measured, prompt_mean=float(prompt_mean), output_tokens=preset.output_len or
        round(output_mean), output_mean=float(output_mean),
        kv_offload=(_cell(row, "kv offload") or "").lower().startswith("yes"), source=where,
        notes=tuple(n for n in [_cell(row, "folder")] if n))
