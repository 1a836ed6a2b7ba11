"""Weight-only quantization of linear layers, computed with torch's packed kernels.

- int8: symmetric per output channel (scale = max|w| / 127), torch's int8-weight GEMM
  (aten._weight_int8pack_mm) -- 1 byte a weight plus a scale per row.
- int4: asymmetric per group of `group_size` inputs along each row (scale = (max - min) / 15, zero
  point at the group's middle), packed two to a byte for torch's int4 GEMMs
  (aten._weight_int4pack_mm_for_cpu on CPU; aten._weight_int4pack_mm, tinygemm, on CUDA, which
  takes bfloat16 activations) -- half a byte a weight plus a scale and zero per group.
- fp8: e4m3 weights with a scale per row, dequantized to the compute dtype at each use (storage
  only: torch has no fp8 weight GEMM on CPU).

- w8a8: int8 weights as int8's, and the activations quantized to int8 per tensor at each step
  (CPU only: fbgemm's and oneDNN's int8 GEMMs) -- its own mode, since it rounds activations too.

Which kernel computes a layer is chosen by measurement per row bucket (engine/quant_kernels.py;
`QuantizedWeight.choice`). `quantize_weight` returns the stored tensors and
`dequantize` their exact float value, so a test can compare the kernels with a plain GEMM on the
dequantized weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.policy.config import check_quantization
from engine.quant_kernels import KERNELS, KernelChoice, choose

@dataclass
class QuantizedWeight:
    mode: str
    data: torch.Tensor  # int8 [n, k]; int4 packed uint8 [n, k / 2]; fp8 [n, k]
    scales: torch.Tensor  # int8 / fp8: [n]; int4: scales and zeros [k / group, n, 2]
    group_size: int
    shape: tuple[int, int]
    int4_values: torch.Tensor | None = None  # int4: the unpacked 0..15 values (kept only for dequantize)
    choice: KernelChoice | None = None  # the kernel per row bucket (engine/quant_kernels.py)
    prepared: dict[str, object] = field(default_factory=dict)  # the chosen kernels' own forms of the weight

    @property
    def nbytes(self) -> int:
        """Bytes held: the stored weight (unless a packed copy replaced it) and scales, and the
        chosen kernels' forms (fbgemm's packed matrix keeps the original beside it: 2 bytes a weight)."""
        held = [self.data, self.scales] + [t for t in self.prepared.values() if isinstance(t, torch.Tensor)]
        total = sum(t.numel() * t.element_size() for t in held if not t.is_mkldnn)
        weights = self.shape[0] * self.shape[1]
        return total + weights * (("onednn" in self.prepared) + 2 * ("fbgemm" in self.prepared))

    def choose_kernels(self, dtype: torch.dtype, pinned: str | None = None) -> None:
        """Pick the kernel per row bucket (measured, or `pinned`) and keep only what it reads: a
        packed copy replaces the stored int8 weight."""
        self.choice = choose(self, dtype, self.data.device, pinned)
        kernels = [KERNELS[name] for name in set(self.choice.kernels)]
        for kernel in kernels:
            if kernel.prepare is not None:
                kernel.prepare(self)
        keep = {form for k in kernels for form in k.forms}
        self.prepared = {k: v for k, v in self.prepared.items() if k in keep}
        if all(k.weight_form != "data" for k in kernels):
            self.data = self.data[:0]



def quantize_weight(weight: torch.Tensor, mode: str, group_size: int = 128) -> QuantizedWeight:
    """weight: [out, in] float; returns its quantized form (on the weight's device)."""
    n, k = weight.shape
    check_quantization(mode, group_size, k)
    w = weight.detach().float()
    if mode in ("int8", "w8a8"):
        if mode == "w8a8" and weight.device.type != "cpu":
            raise ValueError("w8a8 runs on CPU only (fbgemm / oneDNN int8 GEMMs); on CUDA use int8, int4 or fp8")
        scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
        q = (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        return QuantizedWeight(mode, q.contiguous(), scales.to(weight.dtype), group_size, (n, k))
    if mode == "fp8":
        scales = (w.abs().amax(dim=1) / torch.finfo(torch.float8_e4m3fn).max).clamp(min=1e-12)
        q = (w / scales[:, None]).to(torch.float8_e4m3fn)
        return QuantizedWeight(mode, q.contiguous(), scales.to(weight.dtype), group_size, (n, k))
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
    if qw.mode == "w8a8" and qw.data.numel() == 0:  # the stored weight went for a packed copy
        if "fbgemm" not in qw.prepared:
            raise ValueError("a layer computed by onednn-w8a8 keeps only oneDNN's packed weight: pin "
                             "fbgemm-w8a8 (quant_kernel) to dequantize it")
        return torch.ops.quantized.linear_unpack(qw.prepared["fbgemm"])[0].dequantize()
    if qw.mode in ("int8", "w8a8", "fp8"):
        return qw.data.float() * qw.scales.float()[:, None]
    n, k = qw.shape
    q = qw.int4_values.float().reshape(n, k // qw.group_size, qw.group_size)
    scales = qw.scales[..., 0].transpose(0, 1).float()[..., None]
    zeros = qw.scales[..., 1].transpose(0, 1).float()[..., None]
    return ((q - 8.0) * scales + zeros).reshape(n, k)


def quantized_matmul(x: torch.Tensor, qw: QuantizedWeight) -> torch.Tensor:
    """x @ W^T for x [tokens, in] in the activations' dtype, by the kernel chosen for its rows."""
    if qw.choice is None:
        qw.choose_kernels(x.dtype)
    return KERNELS[qw.choice.for_rows(x.shape[0])].run(x, qw)
