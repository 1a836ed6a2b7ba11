"""Speculative decoding: greedy outputs unchanged, sampled outputs distributed as the target's,
lookahead slots and rollback in the scheduler, the n-gram proposer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import engine.runner as runner_module
from engine import LLMEngine
from engine.policy.config import CacheConfig, SchedulerConfig
from engine.ngram_proposer import NgramProposer
from engine.policy.sampling_params import SamplingParams
from engine.policy.scheduler import Scheduler
from engine.policy.sequence import Sequence
from engine.spec_decode import SpecStats, verify
from tests.device import engine_config

TINY = dict(model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=64, max_position_embeddings=256)


SMALL_DRAFT = dict(TINY, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=1)
PROPOSERS = {"ngram": {}, "draft-random": dict(draft_model=SMALL_DRAFT, draft_seed=9),
             "draft-self": dict(draft_model=TINY, draft_seed=3)}  # the target's own config and seed


def engine(spec_tokens: int = 0, proposer: str = "ngram", **knobs) -> LLMEngine:
    spec = {}
    if spec_tokens:
        spec = dict(speculative_method="draft" if proposer.startswith("draft") else "ngram",
                    num_speculative_tokens=spec_tokens, **PROPOSERS[proposer])
    return LLMEngine.from_config(TINY, engine_config(max_model_len=256, **spec, **knobs), seed=3)


# -- greedy: token for token --------------------------------------------------------------------
@pytest.mark.parametrize("knobs", [dict(num_blocks=128), dict(num_blocks=24, max_num_batched_tokens=64)])
@pytest.mark.parametrize("gamma, proposer", [(1, "ngram"), (3, "ngram"), (8, "ngram"), (4, "draft-random"),
                                             (4, "draft-self")])
def test_greedy_output_equals_greedy_without_speculation(knobs, gamma, proposer) -> None:
    rng = np.random.default_rng(0)
    shared = [5, 6, 7, 8] * 6  # a shared prefix (prefix-cache hits) that also repeats (n-gram matches)
    prompts = [shared + rng.integers(1, 64, int(rng.integers(3, 30))).tolist() for _ in range(10)]
    prompts += [[9, 10, 11] * 5, list(range(20, 45))]
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    plain = engine(**knobs).generate(prompts, params)
    spec_engine = engine(gamma, proposer, **knobs)
    spec = spec_engine.generate(prompts, params)
    assert [o.output_token_ids for o in spec] == [o.output_token_ids for o in plain]
    stats = spec_engine.spec_stats
    assert stats.verifications > 0
    if proposer == "draft-self":  # the target drafting for itself: every greedy draft is accepted
        assert stats.accepted_tokens == sum(stats.proposed) > 0
    elif proposer == "ngram":
        assert stats.accepted_tokens > 0
    spec_engine.scheduler.block_manager.check_invariants()
    assert spec_engine.scheduler.block_manager.num_used_blocks == 0
    if knobs["num_blocks"] == 24:
        assert sum(o.num_preemptions for o in spec) > 0  # the small pool exercises preemption


def test_speculation_takes_fewer_steps_when_drafts_are_accepted() -> None:
    prompts = [[9, 10, 11] * 5, [3, 4] * 8]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain, spec = engine(num_blocks=64), engine(4, num_blocks=64)
    plain.generate(prompts, params)
    outs = spec.generate(prompts, params)
    accepted = sum(o.num_accepted_drafts for o in outs)
    assert accepted > 0 and spec.num_steps < plain.num_steps
    assert sum(o.num_draft_tokens for o in outs) >= accepted


# -- sampled: the target's distribution ---------------------------------------------------------
VOCAB = 8
CONTEXT = [0, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]  # every token occurs: n-gram lookup always proposes


def _tiny_vocab_engine(spec_tokens: int = 0, proposer: str = "ngram") -> LLMEngine:
    config = dict(TINY, vocab_size=VOCAB)
    spec = {}
    if spec_tokens and proposer == "ngram":
        spec = dict(speculative_method="ngram", num_speculative_tokens=spec_tokens, ngram_min=1)
    elif spec_tokens:  # a different random model with the same tiny vocabulary
        spec = dict(speculative_method="draft", num_speculative_tokens=spec_tokens,
                    draft_model=dict(SMALL_DRAFT, vocab_size=VOCAB), draft_seed=5)
    return LLMEngine.from_config(config, engine_config(max_model_len=64, num_blocks=4096, max_num_seqs=256,
                                                      max_num_batched_tokens=4096, **spec), seed=11)


def _next_token_probs(contexts: list[list[int]]) -> np.ndarray:
    """The target's exact next-token distribution after each context (temperature 1)."""
    outs = _tiny_vocab_engine().generate(
        contexts, SamplingParams(max_tokens=1, temperature=0.0, return_prompt_logits=True, ignore_eos=True))
    return np.stack([torch.softmax(o.prompt_logits[-1].double(), -1).numpy() for o in outs])


def _exact_marginals(depth: int) -> list[np.ndarray]:
    """Marginal distribution of the token at each depth 1..depth after CONTEXT."""
    marginals, paths = [], {(): 1.0}
    for _ in range(depth):
        keys = list(paths)
        probs = _next_token_probs([CONTEXT + list(k) for k in keys])
        marginal = np.zeros(VOCAB)
        new_paths = {}
        for k, row in zip(keys, probs):
            for token in range(VOCAB):
                new_paths[k + (token,)] = paths[k] * row[token]
                marginal[token] += paths[k] * row[token]
        marginals.append(marginal)
        paths = new_paths
    return marginals


def _p_values(samples: np.ndarray, marginals: list[np.ndarray]) -> list[float]:
    out = []
    for depth, expected in enumerate(marginals):
        counts = np.bincount(samples[:, depth], minlength=VOCAB)
        exp = expected / expected.sum() * len(samples)
        keep = exp >= 5  # pool rare cells so the chi-square approximation holds
        observed = np.append(counts[keep], counts[~keep].sum())
        exp = np.append(exp[keep], exp[~keep].sum())
        if exp[-1] == 0:
            observed, exp = observed[:-1], exp[:-1]
        out.append(float(chisquare(observed, exp).pvalue))
    return out


def _samples(spec_tokens: int, n: int, proposer: str = "ngram") -> np.ndarray:
    eng = _tiny_vocab_engine(spec_tokens, proposer)
    # Four tokens, so that the first three are reached through verifications of up to two drafts.
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=i, ignore_eos=True) for i in range(n)]
    outs = eng.generate([CONTEXT] * n, params)
    if spec_tokens:
        assert eng.spec_stats.verifications >= n and len(eng.spec_stats.proposed) == 2  # speculation happened
    return np.array([o.output_token_ids[:3] for o in outs])


N_SAMPLES = 3000


@pytest.fixture(scope="module")
def marginals() -> list[np.ndarray]:
    return _exact_marginals(3)


@pytest.mark.parametrize("spec_tokens, proposer", [(0, "none"), (3, "ngram"), (3, "draft")])
def test_sampled_tokens_follow_the_targets_distribution(marginals, spec_tokens, proposer) -> None:
    p_values = _p_values(_samples(spec_tokens, N_SAMPLES, proposer), marginals)
    assert min(p_values) > 1e-3, p_values


def test_a_broken_acceptance_rule_fails_the_same_test(marginals, monkeypatch) -> None:
    def accept_every_draft(logits, drafts, params, generator, draft_probs=None):
        p = torch.softmax(logits[len(drafts)] / params.temperature, -1)
        return list(drafts), int(torch.multinomial(p, 1, generator=generator).item())

    monkeypatch.setattr(runner_module, "verify", accept_every_draft)
    p_values = _p_values(_samples(3, N_SAMPLES), marginals)
    assert min(p_values) < 1e-3, p_values


def test_rejection_sampling_with_draft_probabilities_is_exact() -> None:
    """A draft distribution q far from the target p: first emitted token ~ p."""
    p_logits = torch.tensor([[2.0, 0.5, 0.1, -1.0, 1.0], [0.0] * 5])
    q = torch.tensor([[0.05, 0.6, 0.05, 0.25, 0.05]])
    params = SamplingParams(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    counts = np.zeros(5)
    for _ in range(6000):
        draft = int(torch.multinomial(q[0], 1, generator=generator).item())
        accepted, token = verify(p_logits, [draft], params, generator, draft_probs=q)
        counts[accepted[0] if accepted else token] += 1
    expected = torch.softmax(p_logits[0].double(), -1).numpy() * counts.sum()
    assert chisquare(counts, expected).pvalue > 1e-3


# -- scheduler: lookahead slots and rollback ----------------------------------------------------
def test_lookahead_slots_use_only_spare_blocks_and_rejected_drafts_give_them_back() -> None:
    s = Scheduler(SchedulerConfig(8, 64, 128, True, num_lookahead_tokens=6), CacheConfig(4, 7, True))
    a = Sequence("a", list(range(10, 18)), SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
    b = Sequence("b", list(range(30, 38)), SamplingParams(max_tokens=8, ignore_eos=True), 0.0)
    s.add(a)
    s.add(b)
    out = s.schedule()  # both prompts: 2 blocks each, 3 blocks free
    s.update(out, {"a": 1, "b": 2}, 0.0)
    out = s.schedule()
    slots = {c.request_id: c.num_tokens for c in out.chunks}
    # Both decodes get their next block first (2 of 3); then a's drafts fill its block and the last
    # free one (3 + 3 of its 6 slots), b's drafts only what its own new block has left (3).
    assert not out.preempted and slots == {"a": 7, "b": 4}
    assert s.block_manager.num_free_blocks == 0
    s.update(out, {"a": 3, "b": 4}, 0.0, accepted={"a": [], "b": [7]})  # a's drafts rejected, b's first kept
    assert a.num_computed_tokens == 9 and a.token_ids[-2:] == [1, 3]
    assert b.num_computed_tokens == 10 and b.token_ids[-3:] == [2, 7, 4]
    assert s.block_manager.num_free_blocks == 1  # the block held only for a's drafts is back
    assert len(a.block_table) == -(-len(a.token_ids) // 4)
    s.block_manager.check_invariants()


def test_accepted_drafts_are_appended_and_stop_rules_apply_midway() -> None:
    s = Scheduler(SchedulerConfig(8, 64, 128, True, num_lookahead_tokens=4), CacheConfig(4, 32, True), [99])
    a = Sequence("a", [5, 6, 7], SamplingParams(max_tokens=10), 0.0)
    s.add(a)
    s.update(s.schedule(), {"a": 8}, 0.0)
    out = s.schedule()
    assert out.chunks[0].num_tokens == 5  # last token + 4 lookahead slots
    finished = s.update(out, {"a": 12}, 1.0, accepted={"a": [9, 99, 11]})  # 99 is EOS
    assert [f.request_id for f in finished] == ["a"] and a.output_token_ids == [8, 9, 99]
    assert s.block_manager.num_used_blocks == 0


# -- proposer and stats --------------------------------------------------------------------------
def test_ngram_proposer_continues_the_latest_match_of_the_longest_suffix() -> None:
    proposer = NgramProposer(1, 3)
    assert proposer.propose([1, 2, 3, 4, 1, 2, 3], 2) == [4, 1]
    assert proposer.propose([1, 2, 9, 5, 2, 7, 5, 2], 3) == [7, 5, 2]  # latest "5 2", not the first "2"
    assert proposer.propose([1, 2, 3], 4) == []
    assert proposer.propose([4, 4], 3) == [4]


def test_spec_stats_per_position() -> None:
    stats = SpecStats()
    stats.record(3, 1, 3)
    stats.record(2, 2, 3)
    stats.record(0, 0, 3)  # slots given, nothing proposed (an n-gram lookup that found nothing)
    assert stats.acceptance_by_position == [1.0, 0.5, 0.0]
    assert stats.acceptance_by_slot == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert stats.mean_accepted_per_verification == 1.5


def test_bad_speculative_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens must be 1..8"):
        engine_config(speculative_method="ngram", num_speculative_tokens=9)
    with pytest.raises(ValueError, match="not supported"):
        engine_config(speculative_method="medusa", num_speculative_tokens=2)


def test_a_draft_model_needs_a_config_and_the_targets_vocabulary() -> None:
    with pytest.raises(ValueError, match="needs draft_model"):
        engine_config(speculative_method="draft", num_speculative_tokens=2)
    with pytest.raises(ValueError, match="vocabulary"):
        LLMEngine.from_config(TINY, engine_config(speculative_method="draft", num_speculative_tokens=2,
                                                 draft_model=dict(SMALL_DRAFT, vocab_size=32)))


def test_verified_blocks_are_registered_with_their_accepted_tokens() -> None:
    """A verification that fills a block registers it with the accepted drafts in it, so a later
    request with the same tokens hits it."""
    s = Scheduler(SchedulerConfig(8, 64, 128, True, num_lookahead_tokens=4), CacheConfig(4, 32, True))
    a = Sequence("a", [5, 6, 7], SamplingParams(max_tokens=10, ignore_eos=True), 0.0)
    s.add(a)
    s.update(s.schedule(), {"a": 8}, 0.0)  # tokens 5 6 7 | 8
    out = s.schedule()
    s.update(out, {"a": 13}, 1.0, accepted={"a": [9, 10, 11, 12]})  # computes 8 .. 12: blocks 1 and 2 full
    assert a.token_ids == [5, 6, 7, 8, 9, 10, 11, 12, 13] and a.num_computed_tokens == 8
    assert a.num_registered_blocks == 2
    b = Sequence("b", [5, 6, 7, 8, 9, 10, 11, 12, 40], SamplingParams(max_tokens=2, ignore_eos=True), 0.0)
    assert len(s.block_manager.get_computed_blocks(b)) == 2  # both blocks, with the drafts' tokens in them
    s.block_manager.check_invariants()
