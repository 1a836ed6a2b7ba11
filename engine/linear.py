"""A linear layer that, on CPU, runs oneDNN GEMMs over a weight packed once at load time.

On this project's CPUs the packed GEMM ran 10-50% faster than F.linear for the layer shapes of
a small decoder and 2-3x faster for a wide LM head at decode batch sizes (bench/linear_backends.py).
CUDA, and CPUs where torch lacks oneDNN, use F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.quantization import QuantizedWeight, quantize_weight, quantized_matmul


class Linear(nn.Linear):
    packed: torch.Tensor | None = None
    quantized: QuantizedWeight | None = None

    def quantize(self, mode: str, group_size: int = 128, kernel: str | None = None) -> None:
        """Replace the weight by its quantized form (engine/quantization.py) and choose its kernels
        (engine/quant_kernels.py: `kernel`, else measured); the float weight is dropped, so the
        layer's memory is the quantized bytes."""
        self.quantized = quantize_weight(self.weight, mode, group_size)
        self.quantized.choose_kernels(self.weight.dtype, kernel)
        self.packed = None
        del self.weight
        self.weight = None  # stays an attribute, so nothing reads a stale float weight

    def pack_for_cpu(self) -> bool:
        """Pack the current weight for oneDNN; the weight must not change afterwards."""
        if self.quantized is not None:
            return False
        if self.weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
            return False
        if self.weight.dtype not in (torch.float32, torch.bfloat16):
            return False
        try:
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        except (RuntimeError, AttributeError):  # an op this torch build lacks
            self.packed = None
        return self.packed is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantized is not None:
            y = quantized_matmul(x, self.quantized)
            return y if self.bias is None else y + self.bias
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [None], "")
        return F.linear(x, self.weight, self.bias)
