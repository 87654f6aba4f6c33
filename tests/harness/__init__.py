"""Tests of the test harness itself (the fake upstream), runnable without the proxy."""
