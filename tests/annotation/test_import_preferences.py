"""Importing existing preference data: HH-RLHF, TRL rows, K-way rankings (annotation.imports)."""

import gzip
import io
import json
from pathlib import Path

import pytest

from annotation.errors import Conflict
from annotation.imports import (
    ImportFailed,
    preferences_import,
    render_hh,
    split_hh_dialogue,
    split_hh_pair,
)
from annotation.models import Item, ItemCandidate, Judgment, Prompt, Round, TaskKind
from tests.factories import make_project

pytestmark = pytest.mark.django_db

HH_FILE = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "hh-harmless-dev.jsonl.gz"
)


def _jsonl(rows) -> io.BytesIO:
    return io.BytesIO(
        b"".join((r if isinstance(r, str) else json.dumps(r)).encode() + b"\n" for r in rows)
    )


def _hh(prompt_turns: str, chosen: str, rejected: str) -> dict:
    return {
        "chosen": f"{prompt_turns}\n\nAssistant: {chosen}",
        "rejected": f"{prompt_turns}\n\nAssistant: {rejected}",
    }


# ---- pure parsing ------------------------------------------------------------------------


def test_hh_dialogue_splits_into_messages_and_renders_back_exactly():
    text = "\n\nHuman: Hi  there \n\nAssistant: Hello.\n\nHuman: How are you?"
    messages = split_hh_dialogue(text)
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0]["content"] == "Hi  there "
    assert render_hh(messages) == text


def test_hh_pair_prompt_ends_at_the_last_shared_assistant_turn():
    # Given a chosen dialogue that goes on for more turns than the rejected one
    prefix = "\n\nHuman: Rob a house?"
    chosen = prefix + "\n\nAssistant: Human: no.\n\nAssistant: I won't help."
    rejected = prefix + "\n\nAssistant: At night."
    messages, a, b = split_hh_pair(chosen, rejected)
    assert render_hh(messages) == prefix
    assert render_hh(messages, a) == chosen
    assert render_hh(messages, b) == rejected


# ---- import ------------------------------------------------------------------------------


def test_hh_import_stores_items_and_imported_judgments():
    project = make_project()
    rows = [
        _hh("\n\nHuman: What is 2+2?", "4.", "5."),
        _hh("\n\nHuman: Capital of France?", "Paris.", "Lyon."),
    ]
    report = preferences_import(project=project, stream=_jsonl(rows), fmt="hh", batch="b1")
    assert report.items_created == 2
    assert report.judgments_created == 2
    judgments = Judgment.objects.filter(project=project)
    assert {j.source for j in judgments} == {"imported"}
    assert {j.external_rater for j in judgments} == {"import:b1"}
    assert all(j.annotator_id is None for j in judgments)
    # The chosen answer is the one the canonical choice points at.
    for j in judgments.select_related("item"):
        slots = list(ItemCandidate.objects.filter(item=j.item).order_by("position"))
        winner = slots[0 if j.choice == "A" else 1].candidate.text
        assert winner in ("4.", "Paris.")
    # The batch round is closed so imported items are not served to annotators.
    assert Round.objects.get(pk=report.round_id).status == Round.Status.CLOSED


def test_same_pair_in_either_order_becomes_one_item_with_two_judgments():
    project = make_project()
    rows = [
        {"prompt": "Q?", "chosen": "yes", "rejected": "no", "rater": "w1"},
        {"prompt": "Q?", "chosen": "no", "rejected": "yes", "rater": "w2"},
    ]
    report = preferences_import(project=project, stream=_jsonl(rows), fmt="trl")
    assert report.items_created == 1 and report.items_reused == 1
    assert report.dedup["pair"]["duplicates"] == 1
    assert report.dedup["prompt"]["duplicates"] == 1
    choices = sorted(Judgment.objects.values_list("external_rater", "choice"))
    # One rater preferred "yes", the other "no": opposite canonical choices on one item.
    assert {c for _, c in choices} == {"A", "B"}
    assert Item.objects.count() == 1


def test_trl_conversational_rows_with_prompt_repeated_in_chosen():
    project = make_project()
    prompt = [{"role": "user", "content": "Hi"}]
    rows = [
        {
            "prompt": prompt,
            "chosen": [*prompt, {"role": "assistant", "content": "Hello!"}],
            "rejected": [{"role": "assistant", "content": "Go away."}],
            "strength": "much",
            "confidence": 4,
            "score_chosen": 8.0,
        }
    ]
    report = preferences_import(project=project, stream=_jsonl(rows), fmt="trl")
    assert report.ignored_fields == {"score_chosen": 1}
    assert Prompt.objects.get(project=project).messages == prompt
    judgment = Judgment.objects.get()
    assert (judgment.strength, judgment.confidence) == ("much", 4)


def test_ranking_import_keeps_order_and_ranks():
    project = make_project(task_kind=TaskKind.RANKING, k=3)
    rows = [
        {
            "prompt": "Pick",
            "candidates": ["a", {"text": "b", "model_name": "m2"}, "c"],
            "ranking": [2, 1, 3],
        }
    ]
    preferences_import(project=project, stream=_jsonl(rows), fmt="ranking")
    judgment = Judgment.objects.get()
    assert judgment.ranking == [2, 1, 3] and judgment.choice == ""
    texts = list(
        ItemCandidate.objects.order_by("position").values_list("candidate__text", flat=True)
    )
    assert texts == ["a", "b", "c"]


def test_every_bad_line_is_reported_and_nothing_is_written():
    project = make_project()
    rows = [
        _hh("\n\nHuman: ok", "fine", "bad"),
        "{not json",
        {"chosen": "no dialogue", "rejected": "at all"},
        _hh("\n\nHuman: same", "x", "x"),
        {"prompt": "p", "chosen": "a", "rejected": "b", "strength": "huge"},
        _hh("\n\nHuman: ok2", "fine", "bad"),
    ]
    with pytest.raises(ImportFailed) as caught:
        preferences_import(project=project, stream=_jsonl(rows), fmt="hh")
    lines = sorted({line for line, _ in caught.value.errors})
    assert lines == [2, 3, 4, 5]
    assert caught.value.total_bad == 4
    assert not Item.objects.exists() and not Judgment.objects.exists()
    assert not Prompt.objects.exists() and not Round.objects.exists()


def test_importing_the_same_batch_twice_is_refused():
    project = make_project()
    rows = [{"prompt": "Q", "chosen": "a", "rejected": "b"}]
    preferences_import(project=project, stream=_jsonl(rows), fmt="trl")
    with pytest.raises(Conflict):
        preferences_import(project=project, stream=_jsonl(rows), fmt="trl")
    assert Judgment.objects.count() == 1


def test_near_duplicate_prompts_are_reported():
    project = make_project()
    base = "Tell me how to bake a simple loaf of bread at home with flour water and yeast"
    rows = [
        {"prompt": base, "chosen": "a", "rejected": "b"},
        {"prompt": base + " please", "chosen": "a", "rejected": "b"},
        {
            "prompt": "Something else entirely about cars and engines",
            "chosen": "a",
            "rejected": "b",
        },
    ]
    report = preferences_import(
        project=project, stream=_jsonl(rows), fmt="trl", near_duplicates=True
    )
    near = report.dedup["near_duplicate_prompt"]
    assert near["duplicates"] == 1
    assert near["examples"][0]["similar_to"] == "line 1"


def test_hh_file_imports_whole(tmp_path):
    if not HH_FILE.exists():
        pytest.skip("shared HH-RLHF sample is absent")
    project = make_project(max_text_chars=200_000)
    with gzip.open(HH_FILE, "rb") as fh:
        report = preferences_import(project=project, stream=fh, fmt="hh", batch="hh-dev")
    assert report.lines == 1189
    assert report.judgments_created == 1189
    assert report.items_created + report.items_reused == 1189
    assert report.dedup["pair"]["duplicates"] == report.items_reused
