"""Roofline x efficiency: the time model for operators on hardware without (or beyond) a profile. No torch.

For an operator doing F FLOPs and moving B bytes on a device with peak P (FLOP/s) and bandwidth W
(bytes/s), the ideal times are tc = F/P and tm = B/W. Each side takes the larger of its ideal time
at a sustained efficiency and a floor (the time below which the device cannot go however small the
problem), joined smoothly:

    t_c = ((tc / ec_max) ** pc + fc ** pc) ** (1 / pc)      (fc = exp(log_fc), likewise t_m)
    t   = t0 + max(t_c, t_m)

so achieved efficiency rises in proportion to size for small problems and levels off at ec_max /
em_max; the sharpness pc, pm sets how abruptly. t never decreases with size, and with ec_max,
em_max <= 1 it is never below the roofline max(tc, tm) (the cost model also clamps to it).
Parameters are fitted per operator and per operator family (calibrate/fitting/curve.py).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property

from engine.policy.dtypes import DTYPE_BYTES


@dataclass(frozen=True)
class EfficiencyCurve:
    t0: float = 5e-6
    ec_max: float = 0.8
    log_fc: float = math.log(2e-5)
    pc: float = 1.0
    em_max: float = 0.8
    log_fm: float = math.log(2e-5)
    pm: float = 1.0

    def time(self, flops: float, nbytes: float, peak_flops: float, bandwidth: float, additive: bool = False) -> float:
        """additive: the two sides run one after the other (a gather, then the math) instead of overlapping."""
        floor_c, floor_m = self._floors
        # Each side max(time, floor), smoothed (exact in the limit of large sharpness); inline: the
        # simulator times a step's operators here.
        compute = memory = 0.0
        if flops > 0:
            x = flops / peak_flops / self.ec_max
            big, p = (x if x >= floor_c else floor_c), self.pc
            compute = big * ((x / big) ** p + (floor_c / big) ** p) ** (1 / p)
        if nbytes > 0:
            x = nbytes / bandwidth / self.em_max
            big, p = (x if x >= floor_m else floor_m), self.pm
            memory = big * ((x / big) ** p + (floor_m / big) ** p) ** (1 / p)
        return self.t0 + (compute + memory if additive else max(compute, memory))

    @cached_property
    def _floors(self) -> tuple[float, float]:
        return math.exp(self.log_fc), math.exp(self.log_fm)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, float]) -> "EfficiencyCurve":
        return cls(**{k: float(v) for k, v in raw.items()})

    @classmethod
    def from_vector(cls, v) -> "EfficiencyCurve":
        return cls(*[float(x) for x in v])

    def vector(self) -> list[float]:
        return [self.t0, self.ec_max, self.log_fc, self.pc, self.em_max, self.log_fm, self.pm]


# -- work of each operator: (FLOPs, bytes) ------------------------------------------------------
def gemm_work(m: int, n: int, k: int, dtype: str) -> tuple[float, float]:
    return 2.0 * m * n * k, float(m * k + k * n + m * n) * DTYPE_BYTES[dtype]


def prefill_attention_work(q_len: int, kv_len: int, num_heads: int, num_kv_heads: int, head_dim: int,
                           dtype: str) -> tuple[float, float]:
    # Causal: query i of the chunk sees kv_len - q_len + i + 1 keys.
    keys = q_len * (kv_len - q_len) + q_len * (q_len + 1) / 2
    flops = 4.0 * keys * num_heads * head_dim
    nbytes = (2 * q_len * num_heads + 2 * kv_len * num_kv_heads) * head_dim * DTYPE_BYTES[dtype]
    return flops, float(nbytes)


def decode_attention_work(kv_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
                          dtype: str) -> tuple[float, float]:
    return decode_attention_work_total(sum(kv_lens), len(kv_lens), num_heads, num_kv_heads, head_dim, dtype)


def decode_attention_work_total(total_kv: int, batch: int, num_heads: int, num_kv_heads: int, head_dim: int,
                                dtype: str) -> tuple[float, float]:
    """decode_attention_work of a batch given its size and total context."""
    flops = 4.0 * total_kv * num_heads * head_dim
    nbytes = (2 * total_kv * num_kv_heads + 2 * batch * num_heads) * head_dim * DTYPE_BYTES[dtype]
    return flops, float(nbytes)


def elementwise_work(tokens: int, width: int, dtype: str) -> tuple[float, float]:
    # Streaming ops: read once, write once (norms also read a weight vector, adds read two
    # inputs: same order). Their arithmetic never limits them, so it is not counted.
    return 0.0, 2.0 * tokens * width * DTYPE_BYTES[dtype]


def kv_write_work(tokens: int, num_kv_heads: int, head_dim: int, dtype: str) -> tuple[float, float]:
    return 0.0, 4.0 * tokens * num_kv_heads * head_dim * DTYPE_BYTES[dtype]
