"""compaction-proxy: an OpenAI-compatible proxy that compacts chat requests in flight."""

__version__ = "0.1.0"
