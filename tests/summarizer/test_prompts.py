"""Our checkpoint and update prompts, custom replacements and the prompt version."""

from __future__ import annotations

import pytest

from compaction_proxy.summarizer._prompts import (
    CHECKPOINT_PROMPT,
    DEFAULT_PROMPTS,
    PROMPT_VERSION,
    UPDATE_PROMPT,
    PromptSet,
    user_message,
)

SECTIONS = (
    "Goal",
    "Constraints & Preferences",
    "Progress",
    "### Done",
    "### In Progress",
    "Key Decisions",
    "Next Steps",
    "Critical Context",
)


@pytest.mark.parametrize("prompt", [CHECKPOINT_PROMPT, UPDATE_PROMPT])
def test_sections_present(prompt: str) -> None:
    for section in SECTIONS:
        assert section in prompt
    assert "verbatim" in prompt.lower() or "character for character" in prompt
    assert "tool results as ground truth" in prompt
    assert "Output only the checkpoint" in prompt


def test_update_prompt_merges_into_the_previous_checkpoint() -> None:
    assert "<previous-checkpoint>" in UPDATE_PROMPT
    assert "In Progress to Done" in UPDATE_PROMPT
    assert "about as long as the previous one" in UPDATE_PROMPT


def test_version_is_short_and_stable() -> None:
    assert len(PROMPT_VERSION) == 12
    assert DEFAULT_PROMPTS.version == PROMPT_VERSION
    assert PromptSet.from_config().version == PROMPT_VERSION
    assert PromptSet.from_config("  ", "").version == PROMPT_VERSION  # blank = unset


def test_custom_prompts_replace_ours() -> None:
    both = PromptSet.from_config("Summarize tersely.", "Merge tersely.")
    assert (both.checkpoint, both.update) == ("Summarize tersely.", "Merge tersely.")
    assert both.version != PROMPT_VERSION


def test_custom_prompt_alone_serves_updates_too() -> None:
    prompts = PromptSet.from_config("Summarize tersely.")
    assert prompts.checkpoint == prompts.update == "Summarize tersely."
    assert prompts.system_prompt(None) == "Summarize tersely."
    assert prompts.system_prompt("old summary") == "Summarize tersely."


def test_custom_update_prompt_alone_keeps_our_checkpoint_prompt() -> None:
    prompts = PromptSet.from_config(None, "Merge tersely.")
    assert prompts.checkpoint == CHECKPOINT_PROMPT
    assert prompts.update == "Merge tersely."
    assert prompts.version not in (PROMPT_VERSION, PromptSet.from_config("x").version)


def test_system_prompt_choice() -> None:
    assert DEFAULT_PROMPTS.system_prompt(None) == CHECKPOINT_PROMPT
    assert DEFAULT_PROMPTS.system_prompt("") == UPDATE_PROMPT  # an empty summary is a summary


def test_user_message_delimits_previous_summary_and_transcript() -> None:
    first = user_message("[user]\nhi", None)
    assert first == "<conversation>\n[user]\nhi\n</conversation>"
    update = user_message("[user]\nmore", "## Goal\nX")
    assert update.index("<previous-checkpoint>") < update.index("<conversation>")
    assert "<previous-checkpoint>\n## Goal\nX\n</previous-checkpoint>" in update
