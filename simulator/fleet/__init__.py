"""Replicas running the engine's scheduler under SimPy, routers, metrics: `simulate`."""
