"""Measured serving runs: runs tables, replay folders, deployments, and replaying a workload against an
OpenAI-compatible server over HTTP. No torch."""
