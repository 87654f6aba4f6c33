"""The proxy's hold on CPython's collector: settled once per process after start-up, paused
around large bodies, and the sampled value count that decides the pause."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import orjson
import pytest

from compaction_proxy.engine._offload import _estimated_values, _sampled_values


def run_fresh(code: str) -> str:
    """``code`` in a new interpreter: the collector's state is per process, and this one's
    was settled by whichever app a test started first."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.e2e
def test_settling_freezes_start_up_raises_the_young_threshold_once_and_keeps_a_pause() -> None:
    out = run_fresh(
        """
        import gc
        from compaction_proxy.engine import _offload as o
        assert gc.get_threshold()[0] == 700 and gc.get_freeze_count() == 0
        o.settle_collector()
        first = (gc.get_threshold(), gc.get_freeze_count() > 0)
        gc.set_threshold(123, 10, 10)
        o.settle_collector()  # a second app in the same process changes nothing
        print(first, gc.get_threshold())
        # As a new process again: settled while a large body holds full collections paused.
        o._gc_settled = False
        gc.unfreeze()
        gc.set_threshold(700, 10, 10)
        with o.full_collections_paused():
            o.settle_collector()
            inside = gc.get_threshold()
        print(inside, gc.get_threshold())
        """
    )
    assert out.splitlines() == [
        "((20000, 10, 10), True) (123, 10, 10)",
        f"(20000, 10, {1 << 30}) (20000, 10, 10)",
    ]


def test_the_sampled_count_of_a_large_body_is_close_to_the_full_count() -> None:
    messages = [
        {"role": "tool", "tool_call_id": f"c{i}", "content": "x, y" * (i % 40)}
        for i in range(20_000)
    ]
    raw = orjson.dumps({"model": "m", "messages": messages})
    full, sampled = _estimated_values(raw), _sampled_values(raw)
    assert len(raw) > 4 * 32 * 1024
    assert abs(sampled - full) <= full * 0.25, (sampled, full)


def test_a_small_body_is_counted_whole() -> None:
    raw = orjson.dumps({"messages": [{"role": "user", "content": "a,b"}] * 50})
    assert _sampled_values(raw) == _estimated_values(raw) == raw.count(b",")
