"""Catalogs of accelerators and models (data files + pydantic loaders). No torch."""

from simulator.catalog.hardware import Accelerator, canonical_dtype, get_accelerator, load_hardware
from simulator.catalog.models import ModelSpec, catalog_model_ids, load_model

__all__ = ["Accelerator", "ModelSpec", "canonical_dtype", "catalog_model_ids", "get_accelerator", "load_hardware",
           "load_model"]
