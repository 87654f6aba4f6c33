"""Allows `python -m compaction_proxy`, the same entry point as the `compaction-proxy` script."""

from compaction_proxy.cli import main

raise SystemExit(main())
