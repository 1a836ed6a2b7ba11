"""LLMEngine: add requests, step the scheduler and the model, return outputs."""

from __future__ import annotations

import dataclasses

import gc
import time
import weakref
from collections.abc import Callable, Sequence as Seq
from pathlib import Path
from typing import Any

import torch

from engine.policy.admission import checked_sequence
from engine.policy.config import EngineConfig, ModelConfig
from engine.model import DecoderModel
from engine.outputs import RequestOutput
from engine.runner import TORCH_DTYPES, ModelRunner
from engine.policy.sampling_params import SamplingParams
from engine.draft_proposer import DraftModelProposer
from engine.ngram_proposer import NgramProposer
from engine.policy.scheduler import Scheduler
from engine.policy.sequence import Sequence
from engine.spec_decode import SpecStats
from engine.tp_shard import shard_config
from engine.tp_workers import TPWorkers, start_ranks
from engine.weights import build_decoder, read_safetensors_dir


def resolve_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}: use 'cpu', 'cuda' or 'cuda:N'") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but this machine has no CUDA device: use 'cpu'")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r} is not supported: use 'cpu' or 'cuda'")
    return device


class LLMEngine:
    def __init__(self, model_config: ModelConfig, config: EngineConfig | None = None,
                 state_dict: dict[str, torch.Tensor] | None = None, random_seed: int = 0,
                 draft_state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """An engine over a model; with no state_dict the weights are random (seeded by random_seed).
        draft_state_dict: the draft model's weights (speculative_method='draft')."""
        self.model_config = model_config
        self.config = config = config or EngineConfig()
        self.device = resolve_device(config.device)
        self.dtype = TORCH_DTYPES[config.dtype]
        self.scheduler_config = config.scheduler_config(model_config)
        world = config.tensor_parallel_size  # the model's shards (context parallel ranks hold it whole)
        if config.expert_parallel:
            if not model_config.num_experts:
                raise ValueError("expert_parallel needs a mixture-of-experts model; this one is dense: "
                                 "leave expert_parallel off")
            self.model_config = model_config = dataclasses.replace(model_config, expert_parallel=True)
        # Every rank holds the KV of its heads for the same blocks: the pool is sized on one shard.
        shard = shard_config(model_config, world)
        self.cache_config = config.cache_config(shard)
        self.scheduler = Scheduler(self.scheduler_config, self.cache_config, model_config.eos_token_ids)

        self.tp_workers: TPWorkers | None = None
        if world * config.context_parallel_size == 1:
            self.model = self._build_model(model_config, state_dict, random_seed)
            self.runner = ModelRunner(self.model, shard, self.cache_config, self.device, self.dtype,
                                      config.kv_cache_dtype)
        else:
            self.runner, self.tp_workers = start_ranks(
                model_config, config, self.cache_config, self.scheduler_config.max_model_len, self.device,
                state_dict, random_seed)
            self.model = self.runner.model
            self._finalizer = weakref.finalize(self, self.tp_workers.close)
        self.proposer: NgramProposer | DraftModelProposer | None = None
        if config.speculative_method == "ngram":
            self.proposer = NgramProposer(config.ngram_min, config.ngram_max)
        elif config.speculative_method == "draft":
            draft_config = ModelConfig.from_hf(config.draft_model)
            if draft_config.vocab_size != model_config.vocab_size:
                raise ValueError(f"the draft model's vocabulary ({draft_config.vocab_size}) differs from the "
                                 f"target's ({model_config.vocab_size}): use a draft with the target's tokenizer")
            draft = self._build_model(draft_config, draft_state_dict, config.draft_seed)
            self.proposer = DraftModelProposer(draft, draft_config, self.cache_config, self.device, self.dtype)
        self.spec_stats = SpecStats()
        self._generators: dict[str, torch.Generator | None] = {}
        self._prompt_logits: dict[str, list[torch.Tensor]] = {}
        self._default_generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self.num_steps = 0
        self._num_generated = 0
        # What the engine stamps arrivals, tokens and finishes with. A harness that does work of its
        # own between steps and wants it out of the requests' timings swaps in a clock that stops
        # meanwhile (calibrate/validation/speed_probe.py: ProbedClock).
        self.clock: Callable[[], float] = time.perf_counter
        # Long-lived objects (the model, its parameters, the cache) leave the garbage collector's
        # generations, so its periodic full collections stop scanning them mid-serving (vLLM
        # does the same): collection pauses become short and rare.
        gc.collect()  # garbage in cycles now (an earlier engine's, say) would be frozen for good
        gc.freeze()

    def _build_model(self, config: ModelConfig, state_dict: dict[str, torch.Tensor] | None,
                     seed: int) -> DecoderModel:
        model = build_decoder(config, self.scheduler_config.max_model_len, state_dict, seed, self.device)
        return model.prepare(self.device, self.dtype, self.config.quantization, self.config.quant_group_size,
                             self.config.pack_cpu_weights, self.config.quant_kernel)

    def expert_load(self) -> list[list[int]]:
        """Rows routed to each expert so far, per mixture-of-experts layer (empty for a dense model;
        under expert parallelism, what rank 0's share of the tokens routed)."""
        from engine.moe import SparseMoE

        return [m.expert_load.tolist() for m in self.model.modules() if isinstance(m, SparseMoE)]

    def close(self) -> None:
        """Stop the other tensor- or context-parallel ranks' processes (also done when the engine is collected)."""
        if self.tp_workers is not None:
            self._finalizer()

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, model_or_path: Any, config: EngineConfig | None = None) -> "LLMEngine":
        """From a transformers model object, or a local directory with config.json and safetensors."""
        if isinstance(model_or_path, (str, Path)):
            model_config = ModelConfig.from_hf(model_or_path)
            return cls(model_config, config, read_safetensors_dir(model_or_path))
        if hasattr(model_or_path, "state_dict") and hasattr(model_or_path, "config"):
            model_config = ModelConfig.from_hf(model_or_path.config)
            return cls(model_config, config, model_or_path.state_dict())
        raise ValueError(f"from_hf takes a transformers model or a local model directory, "
                         f"not {type(model_or_path).__name__}")

    @classmethod
    def from_config(cls, config_source: Any, config: EngineConfig | None = None, seed: int = 0) -> "LLMEngine":
        """Random weights for an architecture (a transformers config, dict or config.json path)."""
        return cls(ModelConfig.from_hf(config_source), config, None, random_seed=seed)

    # -- requests -----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: Seq[int],
                    sampling_params: SamplingParams | None = None, arrival_time: float | None = None) -> None:
        params = sampling_params or SamplingParams()
        seq = self.check_request(request_id, prompt_token_ids, params)
        if arrival_time is not None:
            seq.arrival_time = arrival_time
        self.scheduler.add(seq)  # validates before anything else changes
        if params.seed is not None:
            self._generators[seq.request_id] = torch.Generator(device=self.device).manual_seed(params.seed)
        else:
            self._generators[seq.request_id] = self._default_generator
        if params.return_prompt_logits:
            self._prompt_logits[seq.request_id] = []

    def check_request(self, request_id: str, prompt_token_ids: Seq[int], params: SamplingParams) -> Sequence:
        """The request as the engine would hold it, or ValueError naming why it can never be served
        (engine/policy/admission.py)."""
        return checked_sequence(self.scheduler, self.model_config.vocab_size, request_id, prompt_token_ids, params,
                                self.clock())

    def abort_request(self, request_id: str) -> RequestOutput:
        """Stop a request now (its blocks go back to the pool); returns it as it stood, finish
        reason "abort"."""
        seq = self.scheduler.abort(str(request_id), self.clock())
        self._forget(str(request_id))
        return self._output(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def _forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        self._prompt_logits.pop(request_id, None)
        if isinstance(self.proposer, DraftModelProposer):
            self.proposer.forget(request_id)

    # -- stepping -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; return an output for every request that got a token or finished."""
        out = self.scheduler.schedule(self.clock())
        if out.is_empty:
            if self.scheduler.has_unfinished():
                # Every admitted request fits the pool alone, so an idle step with work left is a bug.
                raise RuntimeError("the scheduler scheduled nothing while requests are unfinished")
            return []
        requests = {c.request_id: self.scheduler.requests[c.request_id] for c in out.chunks}
        drafts, draft_probs = self._propose(out, requests) if self.proposer is not None else (None, None)
        result = self.runner.execute(out, requests, self._generators, drafts, draft_probs,
                                     self.tp_workers.send if self.tp_workers is not None else None)
        if result.accepted:
            slots = {c.request_id: c.draft_slots(len(requests[c.request_id].token_ids)) for c in out.chunks}
            for request_id, accepted in result.accepted.items():
                proposed = len(drafts.get(request_id, ())) if drafts else 0
                seq = requests[request_id]
                seq.num_draft_tokens += proposed
                seq.num_accepted_drafts += len(accepted)
                self.spec_stats.record(proposed, len(accepted), slots[request_id])
        for request_id, (first_pos, logits) in result.prompt_logits.items():
            collected = self._prompt_logits[request_id]
            have = sum(t.shape[0] for t in collected)
            if first_pos + logits.shape[0] > have:  # a recompute after preemption repeats positions
                collected.append(logits[have - first_pos:])
        now = self.clock()
        self.scheduler.update(out, result.sampled, now, result.accepted)
        self.num_steps += 1
        outputs = [self._output(requests[r]) for r in result.sampled]
        for o in outputs:
            if o.finished:
                self._forget(o.request_id)
        return outputs

    def _propose(self, out, requests: dict[str, Sequence]) -> tuple[dict[str, list[int]], dict[str, torch.Tensor]]:
        """Draft tokens for every chunk scheduled with lookahead slots (as many as it has), and the
        distributions sampled drafts came from (a draft model's; n-gram drafts are point masses)."""
        if isinstance(self.proposer, DraftModelProposer):
            return self.proposer.propose(out, requests, self._generators)
        drafts = {}
        for c in out.chunks:
            seq = requests[c.request_id]
            slots = c.draft_slots(len(seq.token_ids))
            if slots > 0:
                drafts[c.request_id] = self.proposer.propose(seq.token_ids, slots)
        return drafts, {}

    def _output(self, seq: Sequence) -> RequestOutput:
        logits = None
        if seq.request_id in self._prompt_logits:
            logits = torch.cat(self._prompt_logits[seq.request_id]) if self._prompt_logits[seq.request_id] else None
        return RequestOutput(
            request_id=seq.request_id, prompt_token_ids=seq.prompt_token_ids,
            output_token_ids=seq.output_token_ids, finished=seq.finished, finish_reason=seq.finish_reason,
            arrival_time=seq.arrival_time, first_scheduled_time=seq.first_scheduled_time,
            first_token_time=seq.first_token_time, finish_time=seq.finish_time,
            token_times=list(seq.token_times), num_preemptions=seq.num_preemptions,
            num_cached_prompt_tokens=seq.num_cached_prompt_tokens, prompt_logits=logits,
            num_draft_tokens=seq.num_draft_tokens, num_accepted_drafts=seq.num_accepted_drafts)

    def generate(self, prompts: Seq[Seq[int]],
                 params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run prompts to completion through continuous batching; outputs in input order."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params: give one or one each")
        ids = [f"generate-{self._num_generated + i}" for i in range(len(prompts))]
        self._num_generated += len(prompts)
        for request_id, prompt, p in zip(ids, prompts, params):
            self.add_request(request_id, prompt, p)
        finished: dict[str, RequestOutput] = {}
        while self.has_unfinished_requests():
            for o in self.step():
                if o.finished:
                    finished[o.request_id] = o
        return [finished[r] for r in ids]
