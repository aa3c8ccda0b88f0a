"""A/B benchmark harness and report."""
