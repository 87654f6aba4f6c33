"""Helpers shared by the fixtures in tests/conftest.py and the integration tests."""
