"""Fake servers the integration tests and the benchmarks run against."""
