"""Weight-only quantization of linear layers, computed with torch's packed kernels.

- int8: symmetric per output channel (scale = max|w| / 127), torch's int8-weight GEMM
  (aten._weight_int8pack_mm) -- 1 byte a weight plus a scale per row.
- int4: asymmetric per group of `group_size` inputs along each row (scale = (max - min) / 15, zero
  point at the group's middle), packed two to a byte for torch's int4 GEMMs
  (aten._weight_int4pack_mm_for_cpu on CPU; aten._weight_int4pack_mm, tinygemm, on CUDA, which
  takes bfloat16 activations) -- half a byte a weight plus a scale and zero per group.
- fp8: e4m3 weights with a scale per row, dequantized to the compute dtype at each use (storage
  only: torch has no fp8 weight GEMM on CPU).

On CUDA, int8 weights are dequantized at use (`QuantizedWeight.kernel` says which way a layer
computes): torch's CUDA int8-weight GEMM measured far slower than that. The activations stay in
the model's dtype. `quantize_weight` returns the stored tensors and
`dequantize` their exact float value, so a test can compare the kernels with a plain GEMM on the
dequantized weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import check_quantization

@dataclass
class QuantizedWeight:
    mode: str
    data: torch.Tensor  # int8 [n, k]; int4 packed uint8 [n, k / 2]; fp8 [n, k]
    scales: torch.Tensor  # int8 / fp8: [n]; int4: scales and zeros [k / group, n, 2]
    group_size: int
    shape: tuple[int, int]
    int4_values: torch.Tensor | None = None  # int4: the unpacked 0..15 values (kept only for dequantize)
    kernel: str = "packed"  # "packed": torch's packed GEMM; "dequantize": the float weight made at each use

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scales.numel() * self.scales.element_size()


def quantize_weight(weight: torch.Tensor, mode: str, group_size: int = 128) -> QuantizedWeight:
    """weight: [out, in] float; returns its quantized form (on the weight's device)."""
    n, k = weight.shape
    check_quantization(mode, group_size, k)
    w = weight.detach().float()
    if mode == "int8":
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        q = (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        # On CUDA torch's int8-weight GEMM is far slower than dequantizing at use: serving
        # Llama-3.1-8B on an H200 it made 21 tokens/s at batch 16 where fp8 weights dequantized
        # at use made 298 (bench/gpu_quant.py, 2026-11-29). CUDA dequantizes.
        kernel = "packed" if weight.device.type == "cpu" else "dequantize"
        return QuantizedWeight(mode, q.contiguous(), scales.to(weight.dtype), group_size, (n, k), kernel=kernel)
    if mode == "fp8":
        scales = (w.abs().amax(dim=1) / torch.finfo(torch.float8_e4m3fn).max).clamp(min=1e-12)
        q = (w / scales[:, None]).to(torch.float8_e4m3fn)
        return QuantizedWeight(mode, q.contiguous(), scales.to(weight.dtype), group_size, (n, k), kernel="dequantize")
    on_cuda = weight.device.type == "cuda"
    if on_cuda and n % 8:
        raise ValueError(f"int4 on CUDA needs layers whose output width is a multiple of 8; this one has {n}: "
                         "use int8 or fp8 for this model")
    groups = w.reshape(n, k // group_size, group_size)
    low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
    scales = ((high - low) / 15.0).clamp(min=1e-12)
    zeros = low + 8.0 * scales  # the value of code 8: dequantized w = (q - 8) * scale + zero
    q = ((groups - low) / scales).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    if on_cuda:
        # tinygemm's layout: [n, k / 2] bytes, the even input's code in the high nibble.
        pairs = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        inner_k_tiles = next(t for t in (8, 4, 2) if k % (16 * t) == 0)  # group sizes >= 32 make 2 divide
        packed = torch.ops.aten._convert_weight_to_int4pack(pairs, inner_k_tiles)
    else:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scales_and_zeros = torch.cat([scales.reshape(n, -1, 1), zeros.reshape(n, -1, 1)], 2).transpose(0, 1)
    # The CUDA kernel reads bfloat16 scales whatever the model's dtype.
    scale_dtype = torch.bfloat16 if on_cuda else weight.dtype
    return QuantizedWeight(mode, packed, scales_and_zeros.contiguous().to(scale_dtype), group_size, (n, k),
                           q.to(torch.uint8))


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """The float weight the quantized one stands for."""
    if qw.mode in ("int8", "fp8"):
        return qw.data.float() * qw.scales.float()[:, None]
    n, k = qw.shape
    q = qw.int4_values.float().reshape(n, k // qw.group_size, qw.group_size)
    scales = qw.scales[..., 0].transpose(0, 1).float()[..., None]
    zeros = qw.scales[..., 1].transpose(0, 1).float()[..., None]
    return ((q - 8.0) * scales + zeros).reshape(n, k)


def quantized_matmul(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """x @ W^T for x [tokens, in] in the activations' dtype."""
    if qw.mode == "int8" and qw.kernel == "packed":
        return torch.ops.aten._weight_int8pack_mm(x.contiguous(), qw.data, qw.scales.to(x.dtype))
    if qw.mode == "int4" and x.is_cuda:
        y = torch.ops.aten._weight_int4pack_mm(x.to(torch.bfloat16).contiguous(), qw.data, qw.group_size, qw.scales)
        return y.to(x.dtype)
    if qw.mode == "int4":
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x.contiguous(), qw.data, qw.group_size,
                                                         qw.scales.to(x.dtype))
    return x @ (qw.data.to(x.dtype) * qw.scales.to(x.dtype)[:, None]).t()
