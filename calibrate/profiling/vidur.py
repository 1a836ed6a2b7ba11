"""Import (and export) Vidur's profiling CSVs as servecast profiles. No torch.

Vidur's `mlp.csv` holds, per row, one model shape at one token count and tensor-parallel degree,
with the median time (ms) of each operator of a transformer layer. Each GEMM becomes a `gemm`
measurement with its shard shape; norms, rope, activation and adds become `elementwise`
measurements. The row's shape columns stay in the measurement's tags, so an exported CSV reads
back to the same profile. `all_reduce.csv` and `send_recv.csv` rows become collective measurements.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

from simulator.cost.profile_format import Measurement, Profile

SKU_TO_HARDWARE = {"a100": "a100-80gb", "a40": "a40", "h100": "h100-sxm"}
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = ("emb", "input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
# Vidur's elementwise operators under the names servecast's profiler uses.
ELEMENTWISE_NAMES = {"emb": "embedding", "input_layernorm": "rms_norm", "post_attention_layernorm": "rms_norm_post",
                     "attn_rope": "rope", "mlp_act": "swiglu", "add": "add"}
# Vidur's GEMMs under the engine's layer names.
GEMM_NAMES = {"attn_pre_proj": "qkv_proj", "attn_post_proj": "o_proj", "mlp_up_proj": "gate_up_proj",
              "mlp_down_proj": "down_proj"}
VIDUR_NAMES = {v: k for k, v in {**ELEMENTWISE_NAMES, **GEMM_NAMES}.items()}


def _elementwise_width(op: str, row: dict) -> int:
    tp = row["num_tensor_parallel_workers"]
    head_dim = row["n_embd"] // row["n_head"]
    if op == "attn_rope":
        return (row["n_head"] // tp + max(row["n_kv_head"] // tp, 1)) * head_dim
    if op == "mlp_act":
        return row["n_expanded_embd"] // tp
    return row["n_embd"]
SHAPE_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
                 "num_tensor_parallel_workers")
STATS = ("min", "max", "mean", "median", "std")


def _hardware_from_path(path: Path) -> str:
    """Vidur keeps profiles under .../compute/<sku>/<org>/<model>/<file>.csv."""
    sku = path.parts[-4] if len(path.parts) >= 4 else ""
    if sku not in SKU_TO_HARDWARE:
        raise ValueError(f"{path}: cannot tell the device from the path (sku {sku!r}): pass hardware=")
    return SKU_TO_HARDWARE[sku]


def _gemm_shape(op: str, row: dict) -> tuple[int, int]:
    """(n, k) of a Vidur GEMM on one tensor-parallel shard."""
    tp = row["num_tensor_parallel_workers"]
    head_dim = row["n_embd"] // row["n_head"]
    kv_heads = max(row["n_kv_head"] // tp, 1)
    if op == "attn_pre_proj":
        return (row["n_head"] // tp + 2 * kv_heads) * head_dim, row["n_embd"]
    if op == "attn_post_proj":
        return row["n_embd"], row["n_head"] // tp * head_dim
    if op == "mlp_up_proj":
        return (2 if row["use_gated_mlp"] else 1) * row["n_expanded_embd"] // tp, row["n_embd"]
    return row["n_embd"], row["n_expanded_embd"] // tp


def _read_rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        needed = [f"time_stats.{op}.median" for op in GEMMS] + list(SHAPE_COLUMNS)
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a Vidur mlp.csv, missing columns {', '.join(missing[:4])}")
        rows = []
        for row in reader:
            try:
                shape = {c: (row[c].strip().lower() == "true") if c == "use_gated_mlp" else int(float(row[c]))
                         for c in SHAPE_COLUMNS}
            except ValueError:
                raise ValueError(f"{path}:{reader.line_num}: shape columns must be numbers") from None
            shape["times_ms"] = {}
            for op in GEMMS + ELEMENTWISE:
                value = row.get(f"time_stats.{op}.median")
                if value in (None, ""):
                    continue
                t = float(value)
                if not math.isfinite(t) or t <= 0:
                    raise ValueError(f"{path}:{reader.line_num}: {op} time must be positive, got {value!r}")
                shape["times_ms"][op] = t
            shape["line"] = reader.line_num
            rows.append(shape)
    return rows


def import_vidur_compute(mlp_csv: str | Path, hardware: str | None = None, model: str | None = None) -> Profile:
    """A profile from one Vidur mlp.csv (path .../compute/<sku>/<org>/<model>/mlp.csv)."""
    path = Path(mlp_csv)
    if not path.is_file():
        raise ValueError(f"no Vidur profile at {path}")
    hardware = hardware or _hardware_from_path(path)
    model = model or "/".join(path.parts[-3:-1])
    profile = Profile(hardware, {"device_name": hardware, "dtype": "fp16", "attention": "n/a (mlp.csv)",
                                 "gemm": "vidur (torch fp16)"}, {}, f"vidur import of {path.name} ({model})")
    for index, row in enumerate(_read_rows(path)):
        # Vidur repeats shapes (repeated runs); the row index keeps each run its own row.
        tags = {"model": model, "row": index, **{c: row[c] for c in SHAPE_COLUMNS}}
        m = row["num_tokens"]
        for op, ms in row["times_ms"].items():
            if op in GEMMS:
                n, k = _gemm_shape(op, row)
                profile.measurements.append(Measurement.make("gemm", ms / 1e3, name=GEMM_NAMES[op], tags=tags, m=m,
                                                             n=n, k=k, dtype="fp16"))
            else:
                profile.measurements.append(Measurement.make("elementwise", ms / 1e3, tags=tags,
                                                             name=ELEMENTWISE_NAMES[op], tokens=m,
                                                             width=_elementwise_width(op, row), dtype="fp16"))
    if not profile.measurements:
        raise ValueError(f"{path} holds no rows")
    return profile


ATTENTION_COLUMNS = ("n_embd", "n_q_head", "n_kv_head", "num_tensor_parallel_workers", "batch_size",
                     "prefill_chunk_size", "kv_cache_size", "is_prefill")


def import_vidur_attention(attention_csv: str | Path, hardware: str | None = None) -> Profile:
    """A profile from a Vidur attention.csv: prefill rows (one sequence, a chunk of
    prefill_chunk_size on top of kv_cache_size cached tokens) and decode rows (batch_size
    sequences at kv_cache_size), plus the KV-cache save of each row."""
    path = Path(attention_csv)
    if not path.is_file():
        raise ValueError(f"no Vidur attention profile at {path}")
    hardware = hardware or _hardware_from_path(path)
    profile = Profile(hardware, {"device_name": hardware, "dtype": "fp16", "attention": "vidur attention.csv"}, {},
                      f"vidur import of {path.name}")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in ATTENTION_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a Vidur attention.csv, missing columns {', '.join(missing)}")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            try:
                shape = {c: int(float(row[c])) for c in ATTENTION_COLUMNS if c != "is_prefill"}
            except ValueError:
                raise ValueError(f"{where}: shape columns must be numbers") from None
            tp = shape["num_tensor_parallel_workers"]
            heads = dict(num_heads=shape["n_q_head"] // tp, num_kv_heads=max(shape["n_kv_head"] // tp, 1),
                         head_dim=shape["n_embd"] // shape["n_q_head"], dtype="fp16")
            prefill = row["is_prefill"].strip().lower() == "true"
            chunk, cached, batch = shape["prefill_chunk_size"], shape["kv_cache_size"], shape["batch_size"]

            def median(op: str) -> float | None:
                value = row.get(f"time_stats.{op}.median")
                if value in (None, ""):
                    return None
                t = float(value)
                if not math.isfinite(t) or t <= 0:
                    raise ValueError(f"{where}: {op} time must be positive, got {value!r}")
                return t / 1e3

            if prefill and (t := median("attn_prefill")) is not None:
                profile.measurements.append(Measurement.make("attention_prefill", t, q_len=chunk,
                                                             kv_len=cached + chunk, **heads))
            if not prefill and (t := median("attn_decode")) is not None:
                profile.measurements.append(Measurement.make("attention_decode", t, batch=batch,
                                                             kv_len=cached + 1, **heads))
            if (t := median("attn_kv_cache_save")) is not None:
                profile.measurements.append(Measurement.make(
                    "kv_write", t, tokens=chunk if prefill else batch, num_kv_heads=heads["num_kv_heads"],
                    head_dim=heads["head_dim"], dtype="fp16"))
    if not profile.measurements:
        raise ValueError(f"{path} holds no attention rows")
    return profile


def import_vidur_network(csv_path: str | Path, hardware: str) -> Profile:
    """A profile of collectives from Vidur's all_reduce.csv or send_recv.csv."""
    path = Path(csv_path)
    if not path.is_file():
        raise ValueError(f"no Vidur network profile at {path}")
    profile = Profile(hardware, {"device_name": hardware, "network": path.parent.name}, {},
                      f"vidur import of {path.name}")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        for row in reader:
            op = row.get("collective") or ("send_recv" if "send_recv" in path.name else "all_reduce")
            value = row.get(f"time_stats.{op}.median")
            if value in (None, ""):
                raise ValueError(f"{path}:{reader.line_num}: no time_stats.{op}.median")
            time_s = float(value) / 1e3
            tags = {"devices_per_node": int(row.get("devices_per_node") or 0)}
            if op == "all_reduce":
                m = Measurement.make("all_reduce", time_s, tags=tags, nbytes=int(float(row["size"])),
                                     world=int(row["num_workers"]))
            else:
                m = Measurement.make("send_recv", time_s, tags=tags, nbytes=int(float(row["size"])))
            profile.measurements.append(m)
    return profile


def export_vidur_compute(profile: Profile, mlp_csv: str | Path) -> None:
    """Write the imported rows of a profile back as a Vidur mlp.csv (medians; other stats equal them)."""
    rows: dict[tuple, dict[str, float]] = defaultdict(dict)
    for m in profile.measurements:
        tags = dict(m.tags)
        if "num_tokens" not in tags or "row" not in tags:
            continue
        key = (tags["row"], *(tags[c] for c in SHAPE_COLUMNS))
        rows[key][VIDUR_NAMES[m.name if m.op == "gemm" else m.get("name")]] = m.time_s * 1e3
    if not rows:
        raise ValueError("the profile has no measurements imported from Vidur: nothing to export")
    ops = [op for op in ELEMENTWISE[:1] + ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                                           "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj",
                                           "add") if any(op in r for r in rows.values())]
    with Path(mlp_csv).open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f"time_stats.{op}.{s}" for op in ops for s in STATS] + list(SHAPE_COLUMNS))
        for key in sorted(rows):
            stats = []
            for op in ops:
                t = rows[key].get(op)
                stats += ["" if t is None else repr(t)] * 4 + ["" if t is None else "0.0"]
            writer.writerow(stats + [str(v) for v in key[1:]])
