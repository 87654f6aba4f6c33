"""The root of every exception compaction-proxy raises.

One family, so a caller that embeds the proxy (or a test) can tell the proxy's own failures
from everything else with one ``except CompactionProxyError``. It lives here, in the bottom
layer, because the core's own errors derive from it too and the core imports nothing above
itself. Each exception keeps the built-in base it had (``ValueError``, ``LookupError``,
``TimeoutError``, ...) beside this one, so code that caught it by that base still does.
"""

from __future__ import annotations


class CompactionProxyError(Exception):
    """Raised by compaction-proxy itself; every other exception class of the package derives
    from it."""
