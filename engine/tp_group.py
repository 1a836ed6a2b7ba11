"""The collectives of one tensor- or context-parallel model: gloo between CPU processes, NCCL
between GPUs.

The process group is built directly on a TCPStore rather than through init_process_group, so it
is an object the model holds, not process-wide state: two engines in one process (a TP=1 and a
TP=2 one in a test, say) never share or clobber a default group.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


class TPGroup:
    def __init__(self, rank: int, world: int, store: dist.Store, device: torch.device,
                 timeout_s: float = 120.0) -> None:
        """Blocks until every rank has joined (the store's rendezvous)."""
        self.rank, self.world, self.device = rank, world, device
        self.store = store  # lives as long as the group that met on it
        timeout = datetime.timedelta(seconds=timeout_s)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            self.group = dist.ProcessGroupNCCL(store, rank, world, options)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, world, timeout)
        # gloo reduces no bfloat16 on every build: reduce such tensors in float32 (every rank
        # rounds the same float32 sum, so the ranks stay identical).
        self._widen_bf16 = device.type != "cuda"

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise sum over ranks of x (every rank gets it)."""
        if self._widen_bf16 and x.dtype in (torch.bfloat16, torch.float16):
            wide = x.float()
            self.group.allreduce([wide]).wait()
            return wide.to(x.dtype)
        x = x.contiguous()
        self.group.allreduce([x]).wait()
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x concatenated along the last dimension, in rank order."""
        return self._all_gather(x, -1)

    def all_gather_first(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's x (same shape on every rank) concatenated along the first dimension, in rank order."""
        return self._all_gather(x, 0)

    def _all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world)]
        self.group.allgather([parts], [x]).wait()
        return torch.cat(parts, dim=dim)

    def all_to_all(self, x: torch.Tensor, send_counts: list[int], recv_counts: list[int]) -> torch.Tensor:
        """Rows of x sent to each rank in turn (send_counts[r] rows to rank r, in order); returns the
        rows received, recv_counts[r] from rank r, in rank order."""
        wide = self._widen_bf16 and x.dtype in (torch.bfloat16, torch.float16)
        send = (x.float() if wide else x).contiguous()
        out = torch.empty((sum(recv_counts),) + tuple(send.shape[1:]), dtype=send.dtype, device=send.device)
        self.group.alltoall_base(out, send, recv_counts, send_counts).wait()
        return out.to(x.dtype) if wide else out

    def start_ring_pass(self, send: torch.Tensor, recv: torch.Tensor) -> list:
        """Start sending `send` to the next rank and receiving `recv` (same shape) from the one
        before; returns the works to wait on. Even ranks post their send first and odd ranks their
        receive, so a ring of blocking sends and receives cannot deadlock."""
        after, before = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        ops = [lambda: self.group.send([send], after, 0), lambda: self.group.recv([recv], before, 0)]
        return [op() for op in (ops if self.rank % 2 == 0 else ops[::-1])]
