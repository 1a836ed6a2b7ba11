"""Fitting: efficiency curves, a device's cost model and framework terms, serving-engine profiles fitted
on measured runs, speculative decoding's inputs, and the held-out checks. No torch, but spec_steps
(it records a running engine's steps)."""
