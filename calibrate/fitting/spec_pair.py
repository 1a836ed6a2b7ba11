"""A target/draft pair whose acceptance means something: two small byte-level Llamas trained on
the Python standard library's own source text (offline, a few minutes on CPU), saved as
transformers checkpoints and reused, plus the acceptance a draft achieves on held-out files.

Random weights make speculative decoding's acceptance meaningless (a random draft agrees with a
random target by chance). Trained on the same text, a small draft predicts much of what a larger
target does -- the regime speculative decoding is for. The corpus is split by file: the last
`heldout_every`-th of the sorted files never reach training, and acceptance is measured on them.
"""

from __future__ import annotations

import json
import math
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

VOCAB = 256  # bytes


@dataclass(frozen=True)
class PairSpec:
    """Architectures of the pair and the training budget."""

    target: dict = field(default_factory=lambda: dict(hidden_size=192, intermediate_size=512, num_hidden_layers=4,
                                                      num_attention_heads=6, num_key_value_heads=2))
    draft: dict = field(default_factory=lambda: dict(hidden_size=96, intermediate_size=256, num_hidden_layers=2,
                                                     num_attention_heads=4, num_key_value_heads=2))
    context: int = 256
    batch: int = 16
    target_seconds: float = 240.0
    draft_seconds: float = 60.0
    learning_rate: float = 2e-3
    seed: int = 0
    heldout_every: int = 20

    def hf_config(self, which: str) -> dict:
        arch = self.target if which == "target" else self.draft
        return dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=VOCAB,
                    max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                    hidden_act="silu", bos_token_id=None, eos_token_id=None, **arch)


def corpus_files(root: Path | None = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    if not files:
        raise ValueError(f"no Python source under {root}: give a corpus directory")
    return files


def split_corpus(files: list[Path], heldout_every: int) -> tuple[bytes, bytes]:
    train, heldout = [], []
    for i, path in enumerate(files):
        # Every heldout_every-th file is held out (the last one, when there are fewer files).
        last = i == len(files) - 1 and len(files) < heldout_every
        (heldout if i % heldout_every == heldout_every - 1 or last else train).append(path.read_bytes())
    if not train:
        raise ValueError("the corpus needs at least two files: one to train on, one held out")
    return b"\n".join(train), b"\n".join(heldout)


def train_model(config: dict, data: bytes, spec: PairSpec, seconds: float,
                on_progress: Callable[[float, float], None] | None = None):
    """Train a LlamaForCausalLM on random windows of data for `seconds`; returns (model, steps, loss)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(LlamaConfig(**config))
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.01)
    generator = torch.Generator().manual_seed(spec.seed)
    started, steps, loss_ema = time.perf_counter(), 0, math.log(VOCAB)
    model.train()
    while time.perf_counter() - started < seconds:
        starts = torch.randint(0, len(tokens) - spec.context - 1, (spec.batch,), generator=generator)
        batch = torch.stack([tokens[s:s + spec.context + 1] for s in starts.tolist()])
        # Warm up the learning rate over the first steps, then hold it.
        for group in optimizer.param_groups:
            group["lr"] = spec.learning_rate * min(1.0, (steps + 1) / 20)
        loss = model(input_ids=batch, labels=batch).loss  # transformers shifts the labels by one itself
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps += 1
        loss_ema = 0.9 * loss_ema + 0.1 * loss.item()
        if on_progress:
            on_progress(time.perf_counter() - started, loss_ema)
    model.eval()
    return model, steps, loss_ema


def train_pair(out: Path, spec: PairSpec = PairSpec(), corpus: Path | None = None,
               on_progress: Callable[[str, float, float], None] | None = None) -> dict:
    """Train target and draft, save them under out/target and out/draft (safetensors), and
    return what was done (also written to out/pair.json)."""
    files = corpus_files(corpus)
    train, heldout = split_corpus(files, spec.heldout_every)
    info = {"spec": asdict(spec), "corpus_files": len(files), "train_bytes": len(train),
            "heldout_bytes": len(heldout)}
    for which, seconds in (("target", spec.target_seconds), ("draft", spec.draft_seconds)):
        model, steps, loss = train_model(spec.hf_config(which), train, spec, seconds,
                                         (lambda t, l, w=which: on_progress(w, t, l)) if on_progress else None)
        model.save_pretrained(out / which)
        info[which] = {"steps": steps, "train_loss": loss, "parameters": sum(p.numel() for p in model.parameters())}
    (out / "heldout.bin").write_bytes(heldout)
    (out / "pair.json").write_text(json.dumps(info, indent=2))
    return info


def measure_acceptance(pair: Path, num_speculative_tokens: int = 4, num_prompts: int = 32, prompt_bytes: int = 96,
                       output_bytes: int = 64, temperature: float = 0.0, seed: int = 0) -> dict:
    """Acceptance per draft position of the pair's draft on held-out text (engine/spec_decode.py
    statistics), with the prompts taken at evenly spaced places of the held-out files."""
    from engine import EngineConfig, LLMEngine
    from engine.policy.config import ModelConfig
    from engine.policy.sampling_params import SamplingParams
    from engine.spec_decode import request_acceptance
    from engine.weights import read_safetensors_dir

    if num_prompts < 1 or prompt_bytes < 1 or output_bytes < 1:
        raise ValueError(f"prompts, prompt bytes and output bytes must be at least 1, got {num_prompts}, "
                         f"{prompt_bytes}, {output_bytes}")
    heldout = (pair / "heldout.bin").read_bytes()
    step = max(1, (len(heldout) - prompt_bytes) // num_prompts)
    prompts = [list(heldout[i * step:i * step + prompt_bytes]) for i in range(num_prompts)]
    config = EngineConfig(speculative_method="draft", num_speculative_tokens=num_speculative_tokens,
                          draft_model=str(pair / "draft" / "config.json"), max_model_len=prompt_bytes + output_bytes + 8,
                          num_blocks=1024, seed=seed)
    engine = LLMEngine(ModelConfig.from_hf(pair / "target"), config, read_safetensors_dir(pair / "target"),
                       draft_state_dict=read_safetensors_dir(pair / "draft"))
    params = [SamplingParams(max_tokens=output_bytes, temperature=temperature, ignore_eos=True, seed=seed + i)
              for i in range(num_prompts)]
    outputs = engine.generate(prompts, params)
    stats = engine.spec_stats.to_dict()
    stats.update({"request_acceptance": request_acceptance(outputs), "num_speculative_tokens": num_speculative_tokens, "temperature": temperature,
                  "prompts": num_prompts, "output_tokens": sum(len(o.output_token_ids) for o in outputs),
                  "steps": engine.num_steps})
    return stats
