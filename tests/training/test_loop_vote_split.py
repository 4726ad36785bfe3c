"""Disagreement mining reads split human votes: AI, repeat, gold and flagged votes split nothing."""

import pytest

from annotation.models import Judgment
from tests.factories import make_items, make_project, make_user
from training import loop

pytestmark = pytest.mark.django_db


def label(project, item, annotator, choice, **fields):
    Judgment.objects.create(
        project=project, item=item, annotator=annotator, choice=choice, **fields
    )


def test_disagreement_mines_items_split_by_primary_unflagged_human_votes_only():
    # Given items split among humans, and items split only by a vote that does not count
    project = make_project()
    even, by_ai, by_repeat, by_flagged, by_gold_check, uneven = make_items(project, 6)
    ann, bob, cat = make_user(), make_user(), make_user()
    label(project, even, ann, "A")
    label(project, even, bob, "B")
    label(project, by_ai, ann, "A")
    label(project, by_ai, None, "B", source="ai", external_rater="ai-rm-1")
    label(project, by_repeat, ann, "A")
    label(project, by_repeat, ann, "B", is_repeat=True)
    label(project, by_flagged, ann, "A")
    label(project, by_flagged, bob, "B", qc_flag="paused")
    label(project, by_gold_check, ann, "A")
    label(project, by_gold_check, bob, "B", is_gold=True)
    label(project, uneven, ann, "A")
    label(project, uneven, bob, "A")
    label(project, uneven, cat, "B")

    # When the next round's prompts are mined for disagreement
    settings = loop.LoopSettings(
        path="dpo",
        prompt_source="pool",
        n_prompts=2,
        random_share=0.0,
        hard_mining="disagreement",
        seed=3,
    )
    chosen = loop.prompts_select(project=project, settings=settings)

    # Then the two human splits are the hard prompts, the most even one first (an AI, repeat,
    # gold-check or flagged vote against the majority would tie with it at a 50% split)
    assert chosen == [even.prompt.text, uneven.prompt.text]
