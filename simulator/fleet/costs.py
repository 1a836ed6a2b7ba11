"""The one factory of a configuration's cost model: its device's (the catalog accelerator's, or a
profiled device's fitted on its profile) under the serving engine it names. The CLI, the app, the
planner and the simulator all get theirs here; calibrate fits a profiled device's first and hands
it in. No torch."""

from __future__ import annotations

from simulator.catalog.engines import EngineProfile
from simulator.cost.model import CostModel, fitted_device
from simulator.fleet.sim_config import SimConfig


def cost_model_for(config: SimConfig, device: CostModel | None = None,
                   engine: EngineProfile | None = None) -> CostModel:
    """config's cost model: `device` (default: CostModel.load of its hardware and profile) under
    `engine` (default: config.engine_profile()). A device model that already carries an engine
    keeps it unless `engine` is given. Never changes `device`."""
    if device is None:
        device = CostModel.load(config.hardware, profile=config.profile, hardware_file=config.hardware_file)
    if device.engine is not None and engine is None:
        return device
    return device.with_engine(engine or config.engine_profile(), config.max_num_seqs, config.max_num_batched_tokens,
                             config.tp)


# How far a configuration's step costs rest on measurements of its own accelerator (cost_basis).
VALIDATED, KERNELS_FITTED, EXTRAPOLATED = "validated", "kernels fitted", "extrapolated"


def cost_basis(config: SimConfig) -> str:
    """config's accelerator_basis under its serving engine."""
    return accelerator_basis(config.accelerator(), config.engine_profile())


def accelerator_basis(accelerator, engine: EngineProfile) -> str:
    """VALIDATED: the engine's profile was fitted on real serving runs on this accelerator;
    KERNELS_FITTED: its kernel costs were fitted on this accelerator's own measurements (a profiled
    device, or the one the shipped curves were fitted on), serving on it never validated;
    EXTRAPOLATED: another device's curves at this one's catalog peaks."""
    if accelerator.id in engine.device_scales:
        return VALIDATED
    if accelerator.profiled or accelerator.id == fitted_device():
        return KERNELS_FITTED
    return EXTRAPOLATED

