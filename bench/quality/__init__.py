"""The quality benchmark with a real summarizer model: `python -m bench.quality` (see
`__main__.py`); the model server it runs is `model_server.py`."""
