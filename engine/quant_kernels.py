"""The kernels that compute a quantized linear layer, and the choice between them by measurement.

A mode (engine/quantization.py) can be computed several ways on a device: torch's packed int8 /
int4 GEMMs with the activations in the model's dtype or cast to bfloat16, the float weight made at
each use, or (w8a8) oneDNN's and fbgemm's int8 GEMMs over dynamically quantized activations. Which
is fastest depends on the CPU, the layer's shape and the rows in the step: on this project's CPUs
torch's packed kernels with fp32 activations ran 5-90x slower than with bfloat16 ones, and fbgemm
beat oneDNN at decode sizes but not for a wide layer at 256 rows (bench/linear_backends.py). So
each layer's kernels are chosen per row bucket by timing the candidates on its shape, once per
process and shape; the choice travels with the layer (QuantizedWeight.choice) and a profile's
fingerprint records the choices it timed (calibrate/profiling/header.py), so the cost model times
what the engine runs. `EngineConfig.quant_kernel` pins one kernel instead.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch


class QuantizedWeight(Protocol):
    """What a kernel reads of a quantized layer's weight (engine/quantization.py's QuantizedWeight,
    which imports this module to choose its kernels)."""

    mode: str
    data: torch.Tensor
    scales: torch.Tensor
    group_size: int
    shape: tuple[int, int]
    prepared: dict[str, object]


@dataclass(frozen=True)
class Kernel:
    name: str
    mode: str  # the QuantizedWeight mode it computes
    devices: tuple[str, ...]
    run: Callable[[torch.Tensor, QuantizedWeight], torch.Tensor]
    # What the activations are computed in: "model" (exact up to float rounding against the
    # dequantized weight), "bfloat16", or "int8" (dynamically quantized per step, per tensor).
    activations: str = "model"
    prepare: Callable[[QuantizedWeight], None] | None = None  # builds the kernel's form of the weight
    fp32_only: bool = False  # a cast of fp32 activations: no candidate for a model already in 16 bits
    # The weight it reads: "data" (QuantizedWeight.data) or its own packed copy, so that a layer
    # keeps one copy: a choice never mixes two forms.
    weight_form: str = "data"
    forms: tuple[str, ...] = ()  # the QuantizedWeight.prepared entries it reads (prepare builds them)
    # Whether it can compute a layer of this (out, in) shape with activations of this dtype.
    accepts: Callable[[tuple[int, int], torch.dtype], bool] = lambda shape, dtype: True


KERNELS: dict[str, Kernel] = {}


def register(kernel: Kernel) -> Kernel:
    KERNELS[kernel.name] = kernel
    return kernel


def candidates(mode: str, device: torch.device, dtype: torch.dtype,
               shape: tuple[int, int] | None = None) -> list[Kernel]:
    return [k for k in KERNELS.values() if k.mode == mode and device.type in k.devices
            and not (k.fp32_only and dtype != torch.float32) and (shape is None or k.accepts(shape, dtype))]


# Rows a choice is made for; a step's rows use the first bucket at least as large (the last beyond).
BUCKETS = (1, 4, 16, 64, 256)


@dataclass(frozen=True)
class KernelChoice:
    kernels: tuple[str, ...]  # one per bucket of BUCKETS

    def for_rows(self, rows: int) -> str:
        for bucket, name in zip(BUCKETS, self.kernels):
            if rows <= bucket:
                return name
        return self.kernels[-1]

    def describe(self) -> str:
        """'fbgemm-w8a8 <=16, onednn-w8a8' -- the form a profile's fingerprint keeps."""
        parts, start = [], 0
        for i in range(1, len(self.kernels) + 1):
            if i == len(self.kernels):
                parts.append(self.kernels[start])
            elif self.kernels[i] != self.kernels[start]:
                parts.append(f"{self.kernels[start]} <={BUCKETS[i - 1]}")
                start = i
        return ", ".join(parts)

    @classmethod
    def parse(cls, text: str) -> KernelChoice:
        names: list[str] = []
        for part in text.split(", "):
            name, _, bound = part.partition(" <=")
            upto = BUCKETS.index(int(bound)) + 1 if bound else len(BUCKETS)
            names += [name] * (upto - len(names))
        if any(n not in KERNELS for n in names):
            raise ValueError(f"unknown quantized kernel in {text!r}; known: {', '.join(KERNELS)}")
        return cls(tuple(names))


# Choices made in this process: (mode, out, in, group, dtype, threads, device) -> KernelChoice.
_CHOSEN: dict[tuple, KernelChoice] = {}


def choice_key(mode: str, shape: tuple[int, int], group_size: int, dtype: torch.dtype,
               device: torch.device) -> tuple:
    return (mode, *shape, group_size, str(dtype).removeprefix("torch."), torch.get_num_threads(), device.type)


def chosen() -> dict[tuple, KernelChoice]:
    """Every choice this process has made or been given (a profile's fingerprint lists them)."""
    return dict(_CHOSEN)


def adopt(key: tuple, choice: KernelChoice) -> None:
    """Use this choice for layers of this key from now on (a resumed profile keeps its kernels)."""
    _CHOSEN[key] = choice


def choose(qw: QuantizedWeight, dtype: torch.dtype, device: torch.device, pinned: str | None = None) -> KernelChoice:
    """The kernel per row bucket for this layer: `pinned`, else the fastest candidate measured."""
    options = candidates(qw.mode, device, dtype, qw.shape)
    if pinned is not None:
        if pinned not in [k.name for k in options]:
            raise ValueError(f"quantized kernel {pinned!r} cannot compute {qw.mode} here ({device.type}, "
                             f"{str(dtype).removeprefix('torch.')}); use one of {', '.join(k.name for k in options)}")
        return KernelChoice((pinned,) * len(BUCKETS))
    if not options:
        raise ValueError(f"no kernel computes {qw.mode} on {device.type}: use "
                         f"{', '.join(sorted({k.mode for k in KERNELS.values() if device.type in k.devices}))}")
    key = choice_key(qw.mode, qw.shape, qw.group_size, dtype, device)
    if key not in _CHOSEN:
        _CHOSEN[key] = _measure(qw, options, dtype, device) if len(options) > 1 else \
            KernelChoice((options[0].name,) * len(BUCKETS))
    return _CHOSEN[key]


def _measure(qw: QuantizedWeight, options: list[Kernel], dtype: torch.dtype, device: torch.device) -> KernelChoice:
    """Time each candidate at each bucket (median of 5 after a warm-up), smallest bucket first; a
    kernel over 8x the best's time leaves the race. Ranks do change with rows (a weight cast at
    each use loses at one row and can win at 64), but not by 8x between buckets, and the slowest
    candidates cost seconds at 256 rows."""
    for kernel in options:
        if kernel.prepare is not None:
            kernel.prepare(qw)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    racing, picks, ratios = list(options), [], {k.name: 0.0 for k in options}
    with torch.inference_mode():
        for rows in BUCKETS:
            x = torch.randn(rows, qw.shape[1], device=device, dtype=dtype)
            times = {}
            for kernel in racing:
                kernel.run(x, qw)
                samples = []
                for _ in range(5):
                    sync()
                    start = time.perf_counter()
                    kernel.run(x, qw)
                    sync()
                    samples.append(time.perf_counter() - start)
                times[kernel.name] = sorted(samples)[2]
            best = min(times, key=times.get)
            picks.append(best)
            for kernel in options:
                ratios[kernel.name] += times[kernel.name] / times[best] if kernel.name in times else float("inf")
            racing = [k for k in racing if times[k.name] <= 8 * times[best]]
    if len({KERNELS[name].weight_form for name in picks}) > 1:  # one copy of the weight: the best kernel overall
        picks = [min(ratios, key=ratios.get)] * len(BUCKETS)
    return KernelChoice(tuple(picks))


# -- the kernels -------------------------------------------------------------------------------

def widen_codes(codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int8 / fp8 codes as floats of `dtype` (exact for bfloat16 and wider).

    torch's CPU cast of float8_e4m3fn is scalar (13 ms for 8.4M codes here); moving its bits into
    bfloat16's layout, with bfloat16's exponent bias fixed by one multiply by 2^120, took 2 ms.
    e4m3's subnormals land on bfloat16 subnormals, which the multiply makes normal again; its NaN
    codes (which quantize_weight never writes) would read as +-480."""
    if codes.dtype != torch.float8_e4m3fn or codes.device.type != "cpu":
        return codes.to(dtype)
    # Sign-extended to 16 bits and shifted left by 4, a code's magnitude lands on bfloat16's
    # bits 4-10 and its sign on bit 15 (and 11-14): the mask 0x87F0 keeps those two.
    bits = codes.view(torch.int8).to(torch.int16).bitwise_left_shift_(4).bitwise_and_(-0x7810)
    return bits.view(torch.bfloat16).mul_(2.0 ** 120).to(dtype)


def _dequantized(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """int8 / fp8: the float weight made at each use, in the activations' dtype."""
    return x @ (widen_codes(qw.data, x.dtype) * qw.scales.to(x.dtype)[:, None]).t()


def _bf16_gemm(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """int8 / fp8: the stored codes cast to bfloat16 (exact: both fit its 8-bit significand), one
    bfloat16 GEMM, the per-channel scale applied to its output rather than to the weight."""
    y = torch.nn.functional.linear(x.to(torch.bfloat16), widen_codes(qw.data, torch.bfloat16))
    return y.to(x.dtype).mul_(qw.scales.to(x.dtype))


def _int8pack(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    return torch.ops.aten._weight_int8pack_mm(x.contiguous(), qw.data, qw.scales.to(x.dtype))


def _bf16_scales(qw: QuantizedWeight) -> None:
    qw.prepared.setdefault("scales_bf16", qw.scales.to(torch.bfloat16))


def _int8pack_bf16(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    y = torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), qw.data, qw.prepared["scales_bf16"])
    return y.to(x.dtype)


def _int4pack(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), qw.data, qw.group_size, qw.scales.to(x.dtype))


def _int4pack_bf16(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16).contiguous(), qw.data, qw.group_size,
                                                   qw.prepared["scales_bf16"])
    return y.to(x.dtype)


def _tinygemm(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    y = torch.ops.aten._weight_int4pack_mm(x.to(torch.bfloat16).contiguous(), qw.data, qw.group_size, qw.scales)
    return y.to(x.dtype)


def _has_vnni() -> bool:
    try:
        return "vnni" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


# Without VNNI, fbgemm's int8 dot products saturate in 16 bits: activations then use 7 bits.
_REDUCE_RANGE = not _has_vnni()


def _prepare_fbgemm(qw: QuantizedWeight) -> None:
    if "fbgemm" in qw.prepared:
        return
    zeros = torch.zeros(qw.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch marks quantized tensors deprecated; fbgemm's prepack takes only them
        warnings.simplefilter("ignore")
        weight = torch._make_per_channel_quantized_tensor(qw.data, qw.scales.double(), zeros, 0)
        qw.prepared["fbgemm"] = torch.ops.quantized.linear_prepack(weight, None)


def _fbgemm_w8a8(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic(x.float(), qw.prepared["fbgemm"], _REDUCE_RANGE).to(x.dtype)


def _prepare_onednn(qw: QuantizedWeight) -> None:
    if "onednn" not in qw.prepared:
        qw.prepared["onednn"] = torch.ops.onednn.qlinear_prepack(qw.data, [1, qw.shape[1]])
        qw.prepared["onednn_zeros"] = torch.zeros(qw.shape[0], dtype=torch.long)


_U8_ZERO = torch.tensor(128)


def _onednn_w8a8(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    # Activations: symmetric per-tensor int8 codes stored as uint8 around 128.
    x = x.float()
    scale = x.abs().amax().clamp(min=1e-8) / 127.0
    qx = (x / scale).round_().add_(128).to(torch.uint8)
    return torch.ops.onednn.qlinear_pointwise.tensor(qx, scale, _U8_ZERO, qw.prepared["onednn"], qw.scales.float(),
                                                     qw.prepared["onednn_zeros"], None, 1.0, 0, torch.float32,
                                                     "none", [], "")


def _bf16_rows_in_sixteens(shape: tuple[int, int], dtype: torch.dtype) -> bool:
    return shape[1] % 16 == 0  # torch's int8-weight GEMM crashes on bfloat16 rows of other widths


register(Kernel("int8pack", "int8", ("cpu",), _int8pack,
                accepts=lambda shape, dtype: dtype != torch.bfloat16 or _bf16_rows_in_sixteens(shape, dtype)))
register(Kernel("int8pack-bf16", "int8", ("cpu",), _int8pack_bf16, "bfloat16", _bf16_scales, fp32_only=True,
                forms=("scales_bf16",), accepts=_bf16_rows_in_sixteens))
# On CUDA torch's int8-weight GEMM is far slower than dequantizing at use: serving Llama-3.1-8B on
# an H200 it made 21 tokens/s at batch 16 where fp8 weights dequantized at use made 298
# (bench/gpu_quant.py, 2026-11-29). No GPU was lent since to race them per shape: CUDA dequantizes.
register(Kernel("dequantize-int8", "int8", ("cpu", "cuda"), _dequantized))
# bfloat16 GEMMs run at twice fp32's rate on CPUs with AVX512-BF16, so at 64+ rows the cast pays for itself
# where torch's int8-weight kernel ran at 0.6-0.75x fp32 (bench/linear_backends.py).
register(Kernel("bf16gemm-int8", "int8", ("cpu",), _bf16_gemm, "bfloat16", fp32_only=True))
register(Kernel("int4pack", "int4", ("cpu",), _int4pack))
register(Kernel("int4pack-bf16", "int4", ("cpu",), _int4pack_bf16, "bfloat16", _bf16_scales, fp32_only=True,
                forms=("scales_bf16",)))
register(Kernel("tinygemm", "int4", ("cuda",), _tinygemm, "bfloat16"))
register(Kernel("dequantize-fp8", "fp8", ("cpu", "cuda"), _dequantized))  # storage only: no fp8 GEMM in torch
register(Kernel("bf16gemm-fp8", "fp8", ("cpu",), _bf16_gemm, "bfloat16", fp32_only=True))
# fbgemm keeps its packed matrix and the original beside it (2 bytes a weight); oneDNN its packed one.
register(Kernel("fbgemm-w8a8", "w8a8", ("cpu",), _fbgemm_w8a8, "int8", _prepare_fbgemm, weight_form="fbgemm",
                forms=("fbgemm",)))
register(Kernel("onednn-w8a8", "w8a8", ("cpu",), _onednn_w8a8, "int8", _prepare_onednn, weight_form="onednn",
                forms=("onednn", "onednn_zeros")))
