"""Integration tests: the real proxy process in front of the fake upstream, over loopback."""
