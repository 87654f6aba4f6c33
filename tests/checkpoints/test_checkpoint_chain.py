"""The hash chain, the namespace and the lookup's short cut, without a server."""

from __future__ import annotations

from compaction_proxy.checkpoints import (
    Checkpoint,
    Checkpoints,
    MemoryStore,
    chain,
    could_have_checkpoint,
    leading_system_count,
    namespace_for,
    scope_of,
)

U1 = {"role": "user", "content": "one"}
A1 = {"role": "assistant", "content": "two"}
U2 = {"role": "user", "content": "three"}


def test_chain_depends_on_every_earlier_message_and_the_namespace() -> None:
    base = chain("ns", [U1, A1, U2])
    assert len(base) == 3 and len(set(base)) == 3
    assert chain("ns", [U1, A1]) == base[:2]  # a prefix has the same hashes
    assert chain("ns", [U1, {"role": "assistant", "content": "TWO"}, U2])[2] != base[2]
    assert chain("other", [U1, A1, U2])[0] != base[0]
    # Key order inside a message does not matter; content does.
    assert chain("ns", [{"content": "one", "role": "user"}]) == base[:1]


def test_namespace_hides_the_credential_and_separates_tenants() -> None:
    alice = namespace_for(
        credential="Bearer sk-alice", summarizer_model="m", prompt_version="v", fingerprint="f"
    )
    bob = namespace_for(
        credential="Bearer sk-bob", summarizer_model="m", prompt_version="v", fingerprint="f"
    )
    assert alice != bob and "sk-alice" not in alice
    assert alice != namespace_for(
        credential="Bearer sk-alice", summarizer_model="m", prompt_version="v2", fingerprint="f"
    )


def test_only_a_single_message_skips_the_checkpoint_lookup() -> None:
    assert not could_have_checkpoint([])
    assert not could_have_checkpoint([U1])
    assert could_have_checkpoint([U1, A1])  # an agent loop compacts inside its first turn
    assert could_have_checkpoint([U1, A1, U2])
    assert leading_system_count([{"role": "system"}, {"role": "developer"}, U1]) == 2


async def test_lookup_builds_the_effective_view_from_the_longest_prefix() -> None:
    store = MemoryStore(100)
    checkpoints = Checkpoints(store, ttl_seconds=60)
    system = {"role": "system", "content": "s"}
    messages = [system, U1, A1, U2, {"role": "assistant", "content": "four"}]
    hashes = chain("ns", messages[1:])
    summary = {"role": "user", "content": "<summary>\nx\n</summary>"}
    await store.put("ns", hashes[2], Checkpoint(messages=(summary, U2), created_at=0.0), 60)
    found = await checkpoints.lookup("ns", messages)
    assert found.hit and found.covered == 3
    assert found.messages == [system, summary, U2, messages[4]]
    single = await checkpoints.lookup("ns", [system, U1])
    assert not single.hit and single.messages == [system, U1]


def _scoped(body: dict[str, object], tenant: str | None = None) -> str:
    return namespace_for(
        credential="Bearer sk-app",
        summarizer_model="m",
        prompt_version="v",
        fingerprint="f",
        scope=scope_of(body, tenant),
    )


def test_the_namespace_holds_the_request_scope() -> None:
    """Tenant isolation: what can reach a summary is part of its key."""
    system = {"role": "system", "content": "You assist Alice."}
    base: dict[str, object] = {"model": "m", "messages": [system, U1, A1]}
    mine = _scoped(base)
    others = [
        {**base, "messages": [{"role": "system", "content": "You assist Bob."}, U1, A1]},
        {**base, "messages": [U1, A1]},
        {**base, "tools": [{"type": "function", "function": {"name": "t"}}]},
        {**base, "functions": [{"name": "t"}]},
        {**base, "user": "end-user-2"},
        {**base, "safety_identifier": "hash-2"},
    ]
    keys = [mine, *(_scoped(o) for o in others), _scoped(base, "tenant-2")]
    assert len(set(keys)) == len(keys)
    # The same scope, however its keys are ordered, is the same namespace; tool_choice, the
    # model's sampling and the messages after the system block are not part of it.
    reordered = {"messages": [{"content": "You assist Alice.", "role": "system"}, U1, A1]}
    assert _scoped({**reordered, "model": "m"}) == mine
    assert _scoped({**base, "tool_choice": "none", "temperature": 0.2}) == mine
    assert _scoped({**base, "messages": [system, U2]}) == mine
