"""SimConfig: everything one simulation needs besides the workload. No torch.

Field names are the CLI's flags in kebab case (DESIGN.md). `SimConfig.check()` resolves the model
and hardware and plans memory, so an inconsistent configuration fails before any simulation with a
message that names the cause and the fix.
"""

from __future__ import annotations

import re

from pydantic import PrivateAttr, ValidationError, model_validator

from engine.policy.config import check_chunked_prefill
from engine.policy.dtypes import EXPERT_ONLY_WEIGHTS
from simulator.catalog.engine_defaults import DEFAULTED, PLAIN, defaults_for
from simulator.catalog.engines import EngineProfile, load_engine
from simulator.catalog.hardware import Accelerator, get_accelerator
from simulator.catalog.models import ModelSpec, load_model
from simulator.cost.memory import MemoryPlan, plan_memory
from simulator.fleet.knobs import (Disaggregation, EngineChoice, Fleet, HostTier, KVCache, Parallelism, Precision,
                                   RunSettings, SchedulerLimits, Served, Speculation)
from simulator.fleet.knobs import check_slos, parse_duration, parse_slos  # noqa: F401 (imported from here too)


def parse_pools(text: str) -> tuple[int, int]:
    """'2:6' -> (prefill replicas, decode replicas); ValueError naming the fix for anything else."""
    match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not match or min(int(match.group(1)), int(match.group(2))) < 1:
        raise ValueError(f"disaggregate={text!r}: write P:D, prefill and decode replicas, each at least 1, e.g. 2:6")
    return int(match.group(1)), int(match.group(2))


def engine_defaults(fields: dict) -> dict:
    """DEFAULTED's values for a configuration's fields (hardware, engine): its serving engine's
    launcher's for the GPU; PLAIN's where either does not resolve (check() then says why)."""
    try:
        accelerator = get_accelerator(fields["hardware"], fields.get("hardware_file"))
        named = fields.get("engine") is not None or fields.get("engine_file") is not None
        engine = load_engine(fields.get("engine"), fields.get("engine_file"), profiled=not named and accelerator.profiled)
    except (KeyError, TypeError, ValueError, OSError):
        return dict(PLAIN)
    return defaults_for(engine.limits, accelerator)


def validation_items(exc: ValidationError) -> list[tuple[str, str]]:
    """A SimConfig error as (field path, message) pairs, pydantic's "Value error, " prefix dropped
    (the field path is empty for the config as a whole)."""
    return [(".".join(str(p) for p in err["loc"]), err["msg"].removeprefix("Value error, ")) for err in exc.errors()]


# Every group, each knob declared once (simulator/fleet/knobs.py). Listed last group first: pydantic
# puts the fields of later bases first, so the fields come in knobs.GROUPS' order.
class SimConfig(Disaggregation, HostTier, EngineChoice, Speculation, RunSettings, SchedulerLimits, KVCache,
                Precision, Fleet, Parallelism, Served):
    """One simulation's configuration: every group's fields, flat (`SimConfig(tp=4)`, `config.tp`),
    checked together here (`_consistent`) and against the model and hardware by `check()`. The
    limits left unset take the serving engine's defaults for the GPU (`_engine_defaults`)."""

    _defaulted: frozenset[str] = PrivateAttr(default=frozenset())  # the fields engine_defaults filled

    @model_validator(mode="wrap")
    @classmethod
    def _engine_defaults(cls, data, handler):
        missing = frozenset(k for k in DEFAULTED if data.get(k) is None) if isinstance(data, dict) else frozenset()
        if missing:
            data = {**data, **{k: v for k, v in engine_defaults(data).items() if k in missing}}
        config = handler(data)
        config._defaulted = missing
        return config

    @model_validator(mode="after")
    def _consistent(self) -> "SimConfig":
        if self.speculative is not None:
            if not 1 <= self.num_speculative_tokens <= 8:
                raise ValueError("speculative decoding needs num_speculative_tokens between 1 and 8")
            if sum(x is not None for x in (self.acceptance, self.acceptance_file, self.acceptance_preset)) != 1:
                raise ValueError("speculative decoding needs the draft acceptance: give acceptance (a rate), "
                                 "acceptance_file (measured per position) or acceptance_preset, one of them")
            if self.acceptance_preset is not None:
                from simulator.catalog.acceptance import preset

                preset(self.acceptance_preset)  # an unknown id is named with the known ones
            if self.speculative == "draft" and self.draft_model is None:
                raise ValueError("speculative=draft needs draft_model (a catalog id or config.json) for its cost")
            if self.scheduler != "continuous":
                raise ValueError("speculative decoding runs in the continuous-batching scheduler: use scheduler=continuous")
        if self.disaggregate is not None:
            self.pools()  # P:D well formed
            if self.replicas != 1:
                raise ValueError(f"with disaggregate={self.disaggregate} the pools' sizes are P and D: leave replicas "
                                 "at 1")
            if self.scheduler != "continuous" or self.speculative is not None:
                raise ValueError("disaggregation is simulated with continuous batching and without speculative "
                                 "decoding: drop the other scheduler or the speculation")
        elif any(v is not None for v in (self.prefill_hardware, self.prefill_tp, self.prefill_quant, self.prefill_cp)):
            raise ValueError("prefill_hardware, prefill_tp, prefill_quant and prefill_cp describe a prefill pool: give "
                             "disaggregate=P:D too, or drop them")
        cp = max(self.cp, self.prefill_cp or 1)
        if cp > 1 and self.pp > 1:
            raise ValueError(f"context parallelism (cp={cp}) is simulated without pipeline parallelism: use pp=1 "
                             "or cp=1")
        if cp > 1 and self.speculative == "draft":
            raise ValueError(f"a draft model's steps under context parallelism (cp={cp}) are not simulated: use "
                             "speculative=ngram or cp=1")
        if self.kv_offload_gb and not self.enable_prefix_caching:
            raise ValueError("kv_offload_gb keeps evicted prefix-cache blocks: it needs enable_prefix_caching")
        if self.kv_offload_gb and self.scheduler != "continuous":
            raise ValueError("kv_offload_gb works with the continuous-batching scheduler: use scheduler=continuous")
        if self.max_model_len is not None:
            check_chunked_prefill(self.max_num_batched_tokens, self.max_model_len, self.enable_chunked_prefill)
        return self

    # -- resolution (raises ValueError with the cause and the fix) ------------------------------
    def model_spec(self) -> ModelSpec:
        return load_model(self.model)

    def accelerator(self) -> Accelerator:
        return get_accelerator(self.hardware, self.hardware_file)

    def engine_profile(self) -> EngineProfile:
        """The engine profile the config names, or its hardware's default."""
        named = self.engine is not None or self.engine_file is not None
        return load_engine(self.engine, self.engine_file, profiled=not named and self.accelerator().profiled)

    @property
    def compute_dtype(self) -> str:
        """GEMMs run in 16 bits under weight-only quantization (mxfp4's experts too, as vLLM's
        MXFP4-BF16 kernels on Hopper), in fp8 with fp8 weights, and nvfp4 at the fp8 rate (its FP4
        tensor cores are twice that: a slow bound on compute-bound steps); activation_dtype overrides."""
        if self.activation_dtype != "auto":
            return self.activation_dtype
        return "fp32" if self.quant == "fp32" else ("fp8" if self.quant in ("fp8", "nvfp4") else "bf16")

    @property
    def cache_dtype(self) -> str:
        if self.kv_dtype != "auto":
            return self.kv_dtype
        return "fp32" if self.compute_dtype == "fp32" else "bf16"

    def resolved_max_model_len(self, model: ModelSpec, plan: MemoryPlan) -> int:
        """The stated max_model_len, else the model's context capped at what the KV cache holds
        (longer requests are then rejected with that reason)."""
        return self.max_model_len or min(model.max_position_embeddings, plan.kv_tokens)

    def check(self) -> tuple[ModelSpec, Accelerator, MemoryPlan]:
        model, accelerator = self.model_spec(), self.accelerator()
        if model.num_heads % self.tp:
            divisors = [d for d in range(1, model.num_heads + 1) if model.num_heads % d == 0 and d <= 16]
            raise ValueError(f"tp={self.tp} does not divide {model.name}'s {model.num_heads} attention heads: "
                             f"use tp in {divisors}")
        if self.expert_parallel:
            model.check_expert_parallel(self.tp)
        if self.pp > model.num_layers:
            raise ValueError(f"pp={self.pp} exceeds {model.name}'s {model.num_layers} layers: use pp <= {model.num_layers}")
        if self.compute_dtype == "fp8" and accelerator.peak_tflops.get("fp8") is None and not accelerator.profiled:
            raise ValueError(f"{accelerator.id} has no fp8 tensor cores in the catalog: use quant=int8 or int4 "
                             "(weight-only) or an fp8-capable accelerator (h100-sxm, h200, l40s, mi300x, ...)")
        if self.quant == "nvfp4" and accelerator.peak_tflops.get("fp4") is None and not accelerator.profiled:
            raise ValueError(f"nvfp4 weights need FP4 tensor cores, which {accelerator.id} has not in the catalog: "
                             "use an FP4-capable accelerator (b200), or quant=mxfp4 (MoE experts), int4 or fp8")
        if self.quant in EXPERT_ONLY_WEIGHTS and not model.is_moe:
            raise ValueError(f"quant={self.quant} quantizes a MoE model's experts (vLLM's Mxfp4Config); {model.name} "
                             "is dense: use int4, fp8 or nvfp4")
        if self.kv_offload_gb and (accelerator.profiled or accelerator.host_link_gbps is None):
            raise ValueError(f"kv_offload_gb needs {accelerator.id}'s link to host memory, which the catalog does not "
                             "give: set host_link_gbps (GB/s, one direction) in a --hardware-file entry")
        draft = self.draft_spec(model)
        if self.num_gpu_blocks is not None:
            blocks = self.num_gpu_blocks
            if self.max_model_len is not None and blocks * self.block_size * self.cp < self.max_model_len:
                ranks = f" x cp={self.cp}" if self.cp > 1 else ""
                raise ValueError(f"num_gpu_blocks={blocks} x block_size={self.block_size}{ranks} holds fewer tokens "
                                 f"than max_model_len={self.max_model_len}: raise num_gpu_blocks or lower "
                                 "max_model_len")
            from simulator.cost.memory import block_layers, kv_bytes_per_token
            per_token = kv_bytes_per_token(model, self.cache_dtype, self.tp, self.pp, block_layers(model, self.pp))
            plan = MemoryPlan(0.0, 0.0, 0.0, 0.0, 0.0, per_token, blocks * self.block_size * per_token,
                              self.block_size, blocks, self.cp)
        else:
            plan = plan_memory(model, accelerator, tp=self.tp, pp=self.pp, weight_precision=self.quant,
                               kv_dtype=self.cache_dtype, gpu_memory_utilization=self.gpu_memory_utilization,
                               block_size=self.block_size, max_num_batched_tokens=self.max_num_batched_tokens,
                               max_num_seqs=self.max_num_seqs, max_model_len=self.max_model_len, draft=draft,
                               cp=self.cp)
        return model, accelerator, plan

    def draft_spec(self, model: ModelSpec) -> ModelSpec | None:
        """The speculative draft model (speculative=draft), checked against the target."""
        if self.speculative != "draft":
            return None
        draft = load_model(self.draft_model)
        if draft.vocab_size != model.vocab_size:
            raise ValueError(f"draft {draft.name} has a {draft.vocab_size}-token vocabulary, {model.name} "
                             f"{model.vocab_size}: a draft must share the target's tokenizer")
        if draft.num_heads % self.tp:
            raise ValueError(f"tp={self.tp} does not divide draft {draft.name}'s {draft.num_heads} heads: "
                             "pick a draft whose heads tp divides")
        return draft

    def pools(self) -> tuple[int, int] | None:
        """(prefill replicas, decode replicas) of a disaggregated fleet, None for a co-located one;
        ValueError for a malformed disaggregate."""
        return None if self.disaggregate is None else parse_pools(self.disaggregate)

    def pool_configs(self) -> tuple["SimConfig", "SimConfig"]:
        """A disaggregated fleet's (prefill pool, decode pool) as fleets of their own."""
        prefill, decode = self.pools()
        plain = {"disaggregate": None, "prefill_hardware": None, "prefill_tp": None, "prefill_quant": None,
                 "prefill_cp": None}
        own = {"hardware": self.prefill_hardware or self.hardware, "tp": self.prefill_tp or self.tp,
               "quant": self.prefill_quant or self.quant, "cp": self.prefill_cp or self.cp}
        if own["hardware"] != self.hardware:
            own["profile"] = None  # a profile times its own device
            own.update({k: v for k, v in engine_defaults({**self.model_dump(), **own}).items() if k in self._defaulted})
        return (self.model_copy(update={**plain, **own, "replicas": prefill}),
                self.model_copy(update={**plain, "replicas": decode}))

    @property
    def gpus_per_replica(self) -> int:
        """A co-located replica's GPUs: cp ranks of pp stages of tp GPUs."""
        return self.tp * self.pp * self.cp

    @property
    def num_gpus(self) -> int:
        if self.disaggregate is not None:
            return sum(c.num_gpus for c in self.pool_configs())
        return self.gpus_per_replica * self.replicas

    def kv_block_bytes(self, plan: MemoryPlan) -> tuple[float, float]:
        """(one GPU's share, the whole replica's) bytes of one of the block manager's KV blocks:
        under context parallelism each of the cp ranks holds block_size tokens of it."""
        per_gpu = plan.kv_bytes_per_token * plan.block_size
        return per_gpu, per_gpu * self.tp * self.pp * self.cp  # multiplied in this order as before cp

    @property
    def num_replicas(self) -> int:
        """Replicas of the fleet, every pool's."""
        return sum(self.pools()) if self.disaggregate is not None else self.replicas

    @property
    def num_engines(self) -> int:
        """Virtual engines of the fleet (pp per replica)."""
        return self.pp * self.num_replicas

    def usd_per_hour(self) -> float | None:
        """What the fleet's GPUs cost an hour (every pool's); None where an accelerator has no price."""
        if self.disaggregate is not None:
            prices = [c.usd_per_hour() for c in self.pool_configs()]
            return None if None in prices else sum(prices)
        price = self.accelerator().price_per_hour_usd
        return None if price is None else price * self.num_gpus
