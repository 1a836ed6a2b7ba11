"""Capacity search over candidate fleets: the grid, the search, its executors and study file."""
