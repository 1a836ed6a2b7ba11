"""Fit a cost model to a device's profile: its own efficiency curves (fit_curves) and the
framework terms of whole steps (fit_framework). The simulator only reads the result
(simulator/cost/fitted.py FittedTerms); load_cost_model is how everyone else gets a profiled
device's cost model. No torch."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from calibrate.fitting.curve import Sample, fit_curve
from simulator.catalog.models import ModelSpec
from simulator.cost.curves import additive, curve_keys_of, fallback, work_of
from simulator.cost.efficiency import EfficiencyCurve
from simulator.cost.fitted import FittedTerms
from simulator.cost.host import (FRAMEWORK_TERMS, MOE_TERMS, SHAPE_CHANGE_TERMS, VERIFY_TERMS, moe_host_features,
                                 shape_change_features)
from simulator.cost.model import CostModel
from simulator.cost.profile_format import Profile, forward_contexts
from simulator.cost.types import Chunk, StepObservation
from simulator.fleet.costs import cost_model_for
from simulator.cost.shape import ReplicaShape
from simulator.cost.step_timer import StepTimer, scheduled


def load_cost_model(hardware: str, profile: str | Path | Profile | None = None,
                    hardware_file: str | Path | None = None,
                    steps: Sequence[StepObservation] = ()) -> CostModel:
    """A cost model of the hardware, fitted on its profile where one is given: the fit file beside
    the profile when it was made from this very profile and no further steps are given, else
    fitted here (seconds)."""
    model = CostModel.unfitted(hardware, profile, hardware_file)
    if model.profile is None:
        return model
    fitted = FittedTerms.beside(profile) if not steps else None
    return model.with_fitted(fitted if fitted is not None else fit_profile(model, model.profile, steps))


def fit_profile(model: CostModel, profile: Profile, steps: Sequence[StepObservation] = ()) -> FittedTerms:
    """Fit the unfitted model's curves, then its framework terms, on a profile (and observed steps)."""
    curves = {**model.curves, **fit_curves(model, profile)}
    framework = fit_framework(model.with_fitted(FittedTerms(curves, model.framework)), profile, steps)
    return FittedTerms(curves, dict(framework))


def fit_curves(model: CostModel, profile: Profile, min_points: int = 6) -> dict[str, EfficiencyCurve]:
    """This device's own efficiency curves fitted on a profile, per operator and per family (each
    operator's on the shape of its family's, fitted first)."""
    groups: dict[str, list[tuple[Sample, str]]] = defaultdict(list)
    for m in profile.measurements:
        work = work_of(m)
        if work is None:
            continue
        for key in curve_keys_of(m):
            groups[key].append((Sample(*work, m.time_s), m.get("dtype") if "dtype" in dict(m.params) else "fp32"))
    # Families first (many points, full curve), then each operator's own levels on its family's shape.
    families = [k for k in groups if ":" not in k]
    fitted: dict[str, EfficiencyCurve] = {}
    curves = dict(model.curves)  # the shipped ones, each replaced as it is fitted
    for key in sorted(groups, key=lambda k: (k not in families, k)):
        samples = groups[key]
        if len(samples) < min_points:
            continue
        dtype = samples[0][1]
        family = fallback(key) if key not in families else None
        shape = curves.get(family) if family in groups else None
        fitted[key] = fit_curve([s for s, _ in samples], model.peak_flops(dtype), model.bandwidth_for(key),
                                start=None if key in families else curves.get(key), shape_from=shape,
                                additive=additive(key))
        curves[key] = fitted[key]
    return fitted


def profiled_forwards(profile: Profile) -> list[StepObservation]:
    """The profile's whole-forward measurements as observed steps."""
    observations = []
    for m in profile.of("forward"):
        p = dict(m.params)
        spec = ModelSpec(name="profiled", model_type="llama", num_layers=p["layers"], hidden_size=p["hidden"],
                         intermediate_size=p["ffn"], num_heads=p["num_heads"], num_kv_heads=p["num_kv_heads"],
                         head_dim=p["head_dim"], vocab_size=p["vocab"], max_position_embeddings=p["kv_len"],
                         num_experts=max(1, p["experts"]), experts_per_token=max(1, p["top_k"]),
                         moe_intermediate_size=p["moe_ffn"], shared_expert_intermediate_size=p["shared_ffn"],
                         num_dense_layers=p["dense_layers"])
        step = [Chunk(p["q_len"], kv) for kv in forward_contexts(p)] + (
            [Chunk(p["extra_q"], p["extra_kv"])] if p["extra_q"] else [])
        observations.append(StepObservation(step, spec, p["dtype"], p["block_size"], m.time_s))
    return observations


def fit_framework(model: CostModel, profile: Profile, steps: Sequence[StepObservation] = ()) -> dict[str, float]:
    """Non-negative least squares of measured whole steps -- the profile's forward points, and
    any engine steps observed on this device (steps) -- on the sum of their operators'
    predictions (scaled) plus per-step and per-layer terms in chunks, prefill chunks, decode
    attention groups and tokens; and where steps were observed in order (previous_tokens), what
    a change of step shape costs (SHAPE_CHANGE_TERMS). Returns the terms (the model's own where
    there are too few steps to fit); model.with_framework(terms) is the fitted model."""
    observations = list(steps) + profiled_forwards(profile)
    rows, measured, has_prefill, chunk_counts, verify_rows, moe_rows, shape_rows = [], [], [], [], [], [], []
    for o in observations:
        timer = StepTimer(model, ReplicaShape(o.model, dtype=o.dtype, block_size=o.block_size))
        ops = timer.explain(scheduled(o.chunks), include_host=False).total_s
        step = timer.compose(scheduled(o.chunks))
        chunks, tokens, prefills, groups, verifying = (step.chunks, step.tokens, step.prefill_chunks, step.groups,
                                                       step.verifying)
        layers = o.model.num_layers
        features = [1.0, chunks, prefills, groups, tokens]
        rows.append([ops, *features, *(layers * x for x in features)])
        verify_rows.append([verifying, layers * verifying])
        moe_rows.append(list(moe_host_features(o.model, tokens)))
        shape_rows.append(list(shape_change_features(o.previous_tokens, tokens)))
        measured.append(o.forward_s)
        has_prefill.append(prefills > 0)
        chunk_counts.append(chunks)
    terms = FRAMEWORK_TERMS
    if any(v for v, _ in verify_rows):
        rows = [row + v for row, v in zip(rows, verify_rows)]
        terms = terms + VERIFY_TERMS
    if any(m for m, _ in moe_rows):
        rows = [row + m for row, m in zip(rows, moe_rows)]
        terms = terms + MOE_TERMS
    if any(halvings or doublings for halvings, doublings in shape_rows):
        rows = [row + c for row, c in zip(rows, shape_rows)]
        terms = terms + SHAPE_CHANGE_TERMS
    if len(rows) < 2 * len(FRAMEWORK_TERMS):
        return model.framework
    # Relative errors (each row divided by its time): small decode steps, which set TPOT, weigh
    # as much as large prefill steps. Any replay is mostly small all-decode steps, so each kind
    # of step -- with or without a prefill chunk (those set TTFT), at its batch size to within
    # a factor of two -- gets equal total weight (weights enter squared).
    kinds = [(prefill, max(n, 1).bit_length()) for prefill, n in zip(has_prefill, chunk_counts)]
    per_kind = Counter(kinds)
    balance = np.array([1.0 / np.sqrt(per_kind[kind]) for kind in kinds])
    from scipy.optimize import nnls  # here: scipy's import is a third of a what-if's start-up

    a, b = np.array(rows), np.array(measured)
    weights = balance / b
    coefficients, _ = nnls(a * weights[:, None], b * weights)
    # Dividing by the measured time favours predicting low: a step that happened to run slow
    # weighs less than one that ran fast, so the fit lands below the typical step by about the
    # square of the noise, and every request-level sum of step times inherits it. Reweighting by
    # the *predicted* time (twice, from the first fit) keeps relative weights but makes each step
    # shape's fit its mean.
    for _ in range(2):
        predicted = np.maximum(a @ coefficients, 1e-9)
        weights = balance / predicted
        coefficients, _ = nnls(a * weights[:, None], b * weights)
    return dict(zip(terms, (float(c) for c in coefficients)))


def cost_models_for(config) -> tuple[CostModel, CostModel | None]:
    """A SimConfig's cost model (simulator/fleet/costs.py: under its serving engine) and its
    speculative draft's (None: the target's serves it), fitted on their profiles where the config
    names them."""
    target = cost_model_for(config, load_cost_model(config.hardware, profile=config.profile,
                                                    hardware_file=config.hardware_file))
    draft = load_cost_model(config.hardware, profile=config.draft_profile, hardware_file=config.hardware_file) \
        if config.draft_profile is not None else None
    return target, draft
