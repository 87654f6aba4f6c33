"""Test suite for compaction-proxy (a package so `python -m tests.fakes.upstream` works)."""
