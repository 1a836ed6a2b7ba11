"""Requests in: trace files, synthetic specs, and the block keys of their prompts."""
