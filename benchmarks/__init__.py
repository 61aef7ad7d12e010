"""Benchmarks and long-running checks (not part of the test suite)."""
