"""SchedulerOutput -> packed tensors -> one forward -> sampled tokens (and prompt logits)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from engine.attention import build_metadata
from engine.config import CacheConfig, ModelConfig
from engine.kv_cache import KVCache
from engine.model import DecoderModel
from engine.sampler import sample
from engine.scheduler import SchedulerOutput
from engine.sequence import Sequence

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class StepResult:
    sampled: dict[str, int] = field(default_factory=dict)
    # request id -> (first position, logits [n, vocab]) of prompt positions computed this step
    prompt_logits: dict[str, tuple[int, torch.Tensor]] = field(default_factory=dict)


class ModelRunner:
    def __init__(self, model: DecoderModel, model_config: ModelConfig, cache_config: CacheConfig,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.model = model
        self.config = model_config
        self.device = device
        self.dtype = dtype
        self.block_size = cache_config.block_size
        self.cache = KVCache(model_config, cache_config, dtype, device)
        self.windows = set(model_config.sliding_windows)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput, requests: Mapping[str, Sequence],
                generators: Mapping[str, torch.Generator | None]) -> StepResult:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        chunks = []
        sample_rows: list[int] = []
        sample_ids: list[str] = []
        logit_ranges: list[tuple[str, int, int, int]] = []  # request, first row, rows, first position
        for chunk in out.chunks:
            seq = requests[chunk.request_id]
            begin = len(input_ids)
            end_pos = chunk.start + chunk.num_tokens
            table = seq.block_table
            input_ids.extend(seq.token_ids[chunk.start:end_pos])
            pos = range(chunk.start, end_pos)
            positions.extend(pos)
            slots.extend(table[p // bs] * bs + p % bs for p in pos)
            chunks.append((chunk.start, chunk.num_tokens, table))
            if chunk.samples:
                sample_rows.append(begin + chunk.num_tokens - 1)
                sample_ids.append(chunk.request_id)
            if seq.sampling.return_prompt_logits and chunk.start < seq.num_prompt_tokens:
                n = min(end_pos, seq.num_prompt_tokens) - chunk.start
                logit_ranges.append((chunk.request_id, begin, n, chunk.start))

        meta = build_metadata(slots, chunks, bs, self.windows, self.device)
        hidden = self.model(torch.tensor(input_ids, dtype=torch.long, device=self.device),
                            torch.tensor(positions, dtype=torch.long, device=self.device), meta, self.cache)
        result = StepResult()
        if sample_rows:
            logits = self.model.compute_logits(hidden[torch.tensor(sample_rows, device=self.device)])
            params = [requests[r].sampling for r in sample_ids]
            tokens = sample(logits, params, [generators.get(r) for r in sample_ids])
            result.sampled = dict(zip(sample_ids, tokens))
        for request_id, begin, n, first_pos in logit_ranges:
            result.prompt_logits[request_id] = (first_pos, self.model.compute_logits(hidden[begin:begin + n]).cpu())
        return result
