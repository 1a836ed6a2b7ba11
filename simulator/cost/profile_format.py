"""The servecast profile format: measured operator times of one device. No torch.

A profile is a JSON Lines file. Line 1 is the header; every further line is one measurement:

    {"format": "servecast-profile", "version": 1, "hardware": "cpu-local",
     "fingerprint": {"device_name": ..., "torch": ..., "threads": ..., "dtype": ..., "attention": ...,
                     "gemm": ..., "calls_per_sample": 1},
     "peaks": {"matmul_flops": 2.1e11, "memory_bandwidth": 2.7e10},
     "bandwidth_by_size": [[262144, 4.4e10], ..., [134217728, 5.1e10]], "source": "servecast profile"}
    {"op": "gemm", "name": "qkv_proj", "m": 64, "n": 1024, "k": 512, "dtype": "fp32", "time_s": 0.00031}
    {"op": "attention_decode", "batch": 16, "kv_len": 512, "num_heads": 8, "num_kv_heads": 4,
     "head_dim": 64, "dtype": "fp32", "time_s": 0.0004}

Operators and their keys (times are medians, in seconds, of one call on one shard):
  gemm               m (tokens), n (output features), k (input features), dtype
  attention_prefill  q_len, kv_len, num_heads, num_kv_heads, head_dim, dtype
  attention_decode   batch, kv_len (same for every sequence), num_heads, num_kv_heads, head_dim, dtype
  attention_verify   batch, q_len, kv_len, num_heads, num_kv_heads, head_dim, dtype: speculative
                     verification, `batch` chunks of q_len queries (a last token and its drafts)
                     each ending at context kv_len, attended together as the engine does
  kv_write           tokens, num_kv_heads, head_dim, dtype
  kv_gather          tokens, num_kv_heads, head_dim, dtype, kv_dtype (none, int8, fp8): reading
                     `tokens` tokens' K and V of one layer from the paged cache (dequantizing them
                     from a quantized cache)
  elementwise        name (rms_norm, rope, swiglu, add, ...), tokens, width (features the op
                     reads per token: hidden for norms and adds, q+k for rope, FFN for swiglu), dtype
  sample             batch, vocab
  step_overhead      batch (host-side scheduling per engine step: schedule() and update())
  idle_wakeup        idle_ms: how much longer the first step after idle_ms of idleness takes than one
                     run back to back (caches and cores cool down while the engine waits)
  forward            layers, batch, q_len, kv_len, extra_q, extra_kv, hidden, ffn, num_heads,
                     num_kv_heads, head_dim, vocab, block_size, dtype: one whole model-runner step
                     (input preparation, forward, LM head, sampling) of a model of that shape and
                     depth, over `batch` sequences that each compute q_len tokens at context kv_len
                     (spread = 1: contexts spread evenly from kv_len / 8 to kv_len, as in a real
                     batch, which the engine attends in several padded groups), plus (extra_q > 0) one more sequence computing extra_q tokens at context extra_kv
                     (a prefill chunk among decodes). The cost model fits what the
                     operators above leave out (framework overhead per step and per layer) on these
  all_reduce         nbytes, world
  send_recv          nbytes
  kv_ring            nbytes, world: one hop of context parallelism's ring, every rank sending
                     nbytes to the next at once

`peaks` are the device's measured best matmul rate (FLOP/s) and copy bandwidth (bytes/s);
`bandwidth_by_size` (optional) is the read bandwidth measured over working sets of several sizes
(bytes, bytes/s): on CPUs a working set that stays in cache reads several times faster than DRAM;
`hardware` names a catalog entry. Appending one line per finished measurement makes a profile
resumable: a rerun skips every measurement already in the file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Keys that may be 0 (all others must be positive), with their value when a line omits them.
# Keys that may be absent (read as 0): a forward of a dense model has no experts.
ZERO_KEYS = {"extra_q": 0, "extra_kv": 0, "spread": 0, "experts": 0, "top_k": 0, "moe_ffn": 0, "shared_ffn": 0,
             "dense_layers": 0}
FORMAT = "servecast-profile"
VERSION = 1

OP_KEYS: dict[str, tuple[str, ...]] = {
    "gemm": ("m", "n", "k", "dtype"),
    # A linear layer with weight-only quantized weights (engine/quantization.py) and dtype activations.
    "gemm_quant": ("m", "n", "k", "dtype", "weight_dtype", "group_size"),
    "attention_prefill": ("q_len", "kv_len", "num_heads", "num_kv_heads", "head_dim", "dtype"),
    "attention_decode": ("batch", "kv_len", "num_heads", "num_kv_heads", "head_dim", "dtype"),
    "attention_verify": ("batch", "q_len", "kv_len", "num_heads", "num_kv_heads", "head_dim", "dtype"),
    "kv_write": ("tokens", "num_kv_heads", "head_dim", "dtype"),
    "kv_gather": ("tokens", "num_kv_heads", "head_dim", "dtype", "kv_dtype"),
    "elementwise": ("name", "tokens", "width", "dtype"),
    "sample": ("batch", "vocab"),
    "step_overhead": ("batch",),
    "idle_wakeup": ("idle_ms",),
    "forward": ("layers", "batch", "q_len", "kv_len", "spread", "extra_q", "extra_kv", "hidden", "ffn", "num_heads",
                "num_kv_heads", "head_dim", "vocab", "block_size", "dtype",
                # mixture of experts: experts, top-k, each expert's and the shared expert's width, and
                # how many of the `layers` layers are dense (0 experts: a dense model)
                "experts", "top_k", "moe_ffn", "shared_ffn", "dense_layers"),
    "all_reduce": ("nbytes", "world"),
    "send_recv": ("nbytes",),
    # Mixture of experts (engine/moe.py): `active` experts each over `rows` rows; the router and the
    # grouping / weighted sum of a step's rows; the expert-parallel exchange (nbytes per rank).
    "moe_experts": ("rows", "active", "hidden", "ffn", "dtype"),
    "moe_dispatch": ("tokens", "experts", "top_k", "hidden", "dtype"),
    "all_to_all": ("nbytes", "world"),
    # Context parallelism's ring hop (engine/context_parallel.py): every rank sends nbytes to the next.
    "kv_ring": ("nbytes", "world"),
}


@dataclass(frozen=True)
class Measurement:
    op: str
    params: tuple[tuple[str, Any], ...]  # the op's keys, in OP_KEYS order
    time_s: float
    name: str | None = None  # which layer a GEMM belongs to (informational)
    # Provenance kept with a measurement, e.g. the model shape of an imported Vidur row.
    tags: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str) -> Any:
        return dict(self.params)[key]

    @property
    def key(self) -> tuple:
        return (self.op, self.params)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, **dict(self.params), "time_s": self.time_s}
        if self.name is not None:
            out["name"] = self.name
        if self.tags:
            out["tags"] = dict(self.tags)
        return out

    @classmethod
    def make(cls, op: str, time_s: float, name: str | None = None, tags: dict[str, Any] | None = None,
             **params: Any) -> "Measurement":
        return cls._validated({"op": op, "time_s": time_s, "name": name, "tags": tags or {}, **params},
                              where="measurement")

    @classmethod
    def _validated(cls, raw: dict[str, Any], where: str) -> "Measurement":
        op = raw.get("op")
        if op not in OP_KEYS:
            raise ValueError(f"{where}: unknown op {op!r}; known: {', '.join(OP_KEYS)}")
        missing = [k for k in (*OP_KEYS[op], "time_s") if k not in raw and k not in ZERO_KEYS]
        if missing:
            raise ValueError(f"{where}: {op} measurement lacks {', '.join(missing)}")
        time_s = raw["time_s"]
        if not isinstance(time_s, (int, float)) or not math.isfinite(time_s) or time_s <= 0:
            raise ValueError(f"{where}: time_s must be a positive finite number of seconds, got {time_s!r}")
        params = []
        for k in OP_KEYS[op]:
            value = raw.get(k, ZERO_KEYS.get(k))
            if k not in ("dtype", "name", "weight_dtype", "kv_dtype"):
                smallest = 0 if k in ZERO_KEYS else 1e-300
                if not isinstance(value, (int, float)) or isinstance(value, bool) or value < smallest:
                    what = "a non-negative" if k in ZERO_KEYS else "a positive"
                    raise ValueError(f"{where}: {k} must be {what} number, got {value!r}")
                value = int(value)
            params.append((k, value))
        name = raw.get("name") if op != "elementwise" else None
        tags = raw.get("tags") or {}
        if not isinstance(tags, dict):
            raise ValueError(f"{where}: tags must be a mapping")
        return cls(op, tuple(params), float(time_s), name, tuple(sorted(tags.items())))


@dataclass
class Profile:
    hardware: str
    fingerprint: dict[str, Any]
    peaks: dict[str, float]
    source: str
    measurements: list[Measurement] = field(default_factory=list)
    bandwidth_by_size: list[tuple[int, float]] = field(default_factory=list)

    def header(self) -> dict[str, Any]:
        header = {"format": FORMAT, "version": VERSION, "hardware": self.hardware, "fingerprint": self.fingerprint,
                  "peaks": self.peaks, "source": self.source}
        if self.bandwidth_by_size:
            header["bandwidth_by_size"] = [list(p) for p in self.bandwidth_by_size]
        return header

    def of(self, op: str) -> list[Measurement]:
        return [m for m in self.measurements if m.op == op]

    def save(self, path: str | Path) -> None:
        with Path(path).open("w") as f:
            f.write(json.dumps(self.header()) + "\n")
            for m in self.measurements:
                f.write(json.dumps(m.to_json()) + "\n")

    @staticmethod
    def append(path: str | Path, measurement: Measurement) -> None:
        with Path(path).open("a") as f:
            f.write(json.dumps(measurement.to_json()) + "\n")

    @classmethod
    def load(cls, path: str | Path, known_hardware: set[str] | None = None) -> "Profile":
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no profile at {path}: run `servecast profile` or import one")
        lines = path.read_text().splitlines()
        if not lines:
            raise ValueError(f"{path} is empty: not a servecast profile")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            raise ValueError(f"{path}:1: not JSON: is this a servecast profile?") from None
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            raise ValueError(f"{path}:1: not a servecast profile header (format must be {FORMAT!r})")
        if header.get("version") != VERSION:
            raise ValueError(f"{path}:1: profile version {header.get('version')!r} is not supported (want {VERSION})")
        hardware = header.get("hardware")
        if not isinstance(hardware, str) or (known_hardware is not None and hardware not in known_hardware):
            raise ValueError(f"{path}:1: unknown device {hardware!r}: name a catalog hardware id "
                             "(or add the device in a hardware file)")
        peaks = header.get("peaks") or {}
        for key, value in peaks.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{path}:1: peak {key} must be a positive number, got {value!r}")
        curve = []
        for point in header.get("bandwidth_by_size") or []:
            if (not isinstance(point, list) or len(point) != 2
                    or not all(isinstance(x, (int, float)) and math.isfinite(x) and x > 0 for x in point)):
                raise ValueError(f"{path}:1: bandwidth_by_size entries must be [bytes, bytes_per_s] > 0, got {point!r}")
            curve.append((int(point[0]), float(point[1])))
        profile = cls(hardware, header.get("fingerprint") or {}, dict(peaks), header.get("source", ""),
                      bandwidth_by_size=sorted(curve))
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{number}: not JSON") from None
            profile.measurements.append(Measurement._validated(raw, where=f"{path}:{number}"))
        if not profile.measurements:
            raise ValueError(f"{path} holds no measurements")
        return profile


def forward_contexts(params: dict) -> list[int]:
    """Context lengths of the `batch` uniform sequences of a forward measurement."""
    batch, kv = params["batch"], params["kv_len"]
    if not params.get("spread") or batch == 1:
        return [kv] * batch
    low = max(params["q_len"], kv // 8)
    return [round(low + (kv - low) * i / (batch - 1)) for i in range(batch)]
