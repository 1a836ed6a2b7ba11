"""The ranks of a tensor- or context-parallel engine: the engine's own process is rank 0, and it
starts one process for each other rank.

Rank 0 keeps everything that decides (scheduler, block manager, sampling, drafts); each step it
sends every other rank the step's plan (plain lists: tokens, positions, KV slots, chunks). Under
tensor parallelism all ranks run the same forward over their shard of the weights, summing partial
results and gathering logits over their TPGroup; every rank's KV cache holds its heads of the same
slots. Under context parallelism every rank holds the whole model and runs the forward of its
share of the step's tokens (engine/context_parallel.py); its cache holds its positions of the
same blocks.
"""

from __future__ import annotations

import datetime
import os
import time
import multiprocessing.connection
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.policy.config import CacheConfig, EngineConfig, ModelConfig
from engine.context_parallel import CPRank
from engine.model import DecoderModel
from engine.runner import TORCH_DTYPES, ModelRunner
from engine.step_plan import StepPlan
from engine.tp_group import TPGroup
from engine.tp_shard import shard_config, shard_state_dict
from engine.weights import build_decoder

STARTUP_TIMEOUT_S = 300.0


@dataclass
class RankSpec:
    """What one rank needs to build its shard and cache."""

    rank: int
    world: int
    store_port: int
    model_config: ModelConfig  # the whole model's
    engine_config: EngineConfig
    cache_config: CacheConfig
    max_positions: int
    device: str


def rank_device(device: torch.device, rank: int, world: int) -> torch.device:
    """CPU ranks share the CPU; GPU ranks take consecutive GPUs from the engine's."""
    if device.type != "cuda":
        return device
    first = device.index or 0
    if torch.cuda.device_count() < first + world:
        raise ValueError(f"{world} ranks from {device} need GPUs {first}..{first + world - 1}, "
                         f"but this machine has {torch.cuda.device_count()}: lower tensor_parallel_size or context_parallel_size")
    return torch.device("cuda", first + rank)


def context_parallel(config: EngineConfig) -> bool:
    return config.context_parallel_size > 1


def rank_runner(spec: RankSpec, model: DecoderModel, group: TPGroup) -> ModelRunner:
    """The rank's runner: its KV cache, and under context parallelism its place in the ring."""
    config = spec.engine_config
    cp = CPRank(spec.rank, spec.world, config.block_size, group) if context_parallel(config) else None
    return ModelRunner(model, model.config, spec.cache_config, torch.device(spec.device), TORCH_DTYPES[config.dtype],
                       config.kv_cache_dtype, cp)


def build_shard(spec: RankSpec, state: dict[str, torch.Tensor], group: TPGroup) -> DecoderModel:
    """The rank's model: its tensor-parallel shard, or the whole model under context parallelism."""
    config = spec.engine_config
    if context_parallel(config):
        model = DecoderModel(spec.model_config, spec.max_positions)
    else:
        model = DecoderModel(shard_config(spec.model_config, spec.world), spec.max_positions, group,
                             spec.model_config.vocab_size)
    model.load_state_dict(state)
    return model.prepare(torch.device(spec.device), TORCH_DTYPES[config.dtype], config.quantization,
                         config.quant_group_size, config.pack_cpu_weights, config.quant_kernel)


class TPWorkers:
    """Ranks 1..world-1, each in its own process."""

    def __init__(self, processes: list, conns: list[multiprocessing.connection.Connection]) -> None:
        self.processes = processes
        self.conns = conns

    def send(self, plan: StepPlan) -> None:
        for conn in self.conns:
            conn.send(plan)

    def wait_for(self, wanted: str, timeout_s: float) -> None:
        """Wait until every rank reports `wanted`; raise what a rank reports instead, or its death."""
        for rank, (conn, process) in enumerate(zip(self.conns, self.processes), start=1):
            deadline = time.monotonic() + timeout_s
            while not conn.poll(0.05) and process.is_alive():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rank {rank} did not start within {timeout_s:.0f} s")
            try:
                status, detail = conn.recv()
            except EOFError:  # the process is gone without a word
                process.join(timeout=5)
                raise RuntimeError(
                    f"rank {rank} exited (code {process.exitcode}) before starting; if the "
                    "engine is built in a script, build it under `if __name__ == '__main__':` (each rank is "
                    "a spawned process that imports the script)") from None
            if status != wanted:
                raise RuntimeError(f"rank {rank} failed to start: {detail}")

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.conns, self.processes = [], []


def start_ranks(model_config: ModelConfig, engine_config: EngineConfig, cache_config: CacheConfig,
                max_positions: int, device: torch.device, state_dict: dict[str, torch.Tensor] | None,
                seed: int) -> tuple[ModelRunner, TPWorkers]:
    """Start ranks 1..world-1 and build rank 0's model; returns rank 0's runner and the workers."""
    world = engine_config.tensor_parallel_size * engine_config.context_parallel_size
    for rank in range(world):
        rank_device(device, rank, world)  # every rank's GPU exists
    # The whole model's weights, random ones seeded exactly as a TP=1 engine seeds them, so TP=1 and
    # TP=N serve the same model.
    whole = build_decoder(model_config, max_positions, state_dict, seed).state_dict()

    def state_of(rank: int) -> dict[str, torch.Tensor]:
        return whole if context_parallel(engine_config) else shard_state_dict(whole, model_config, rank, world)
    store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
                          wait_for_workers=False)
    context = mp.get_context("spawn")
    processes, conns = [], []
    for rank in range(1, world):
        spec = RankSpec(rank, world, store.port, model_config, engine_config, cache_config, max_positions,
                        str(rank_device(device, rank, world)))
        parent, child = context.Pipe()
        process = context.Process(target=run_rank, args=(spec, state_of(rank), child), daemon=True)
        process.start()
        child.close()
        processes.append(process)
        conns.append(parent)
    workers = TPWorkers(processes, conns)
    try:
        spec = RankSpec(0, world, store.port, model_config, engine_config, cache_config, max_positions, str(device))
        # Rank 0 joins the group's rendezvous (which blocks) only once every rank runs.
        workers.wait_for("started", STARTUP_TIMEOUT_S)
        group = TPGroup(0, world, store, device)
        runner = rank_runner(spec, build_shard(spec, state_of(0), group), group)
        workers.wait_for("ready", STARTUP_TIMEOUT_S)
    except BaseException:
        workers.close()
        raise
    return runner, workers


def run_rank(spec: RankSpec, state: dict[str, torch.Tensor], conn: multiprocessing.connection.Connection) -> None:
    """A worker rank's process: build its shard, then run the forward of every plan rank 0 sends
    until it sends None."""
    conn.send(("started", None))
    try:
        device = torch.device(spec.device)
        if device.type == "cpu":  # the ranks share the cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.world))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store = dist.TCPStore("127.0.0.1", spec.store_port, spec.world, False,
                              timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S))
        group = TPGroup(spec.rank, spec.world, store, device)
        runner = rank_runner(spec, build_shard(spec, state, group), group)
        del state
    except Exception as e:  # reported to rank 0, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            plan = conn.recv()
        except EOFError:  # rank 0 is gone
            return
        if plan is None:
            return
        runner.forward_logits(plan)
