"""Tests of training.trainers.data: the dataset snapshot contract."""

import json

import pytest

from tests.training.conftest import arithmetic_rows
from training.trainers.data import (
    DatasetError,
    data_hash,
    load_preferences,
    load_prompts,
    load_sft,
    read_manifest,
)


def test_preference_rows_get_defaults_for_missing_margin_and_soft_label(make_snapshot):
    rows = arithmetic_rows(4)
    rows[0]["margin"] = 2.0
    rows[1]["soft_label"] = 0.8
    rows[2]["group_id"] = 7
    rows[3]["annotator_note"] = "ignored"
    rows[3]["tie"] = True
    splits = load_preferences(make_snapshot(train=rows))
    train = splits.train
    assert train.column_names == [
        "prompt",
        "chosen",
        "rejected",
        "margin",
        "soft_label",
        "group_id",
        "tie",
    ]
    assert train["tie"] == [False, False, False, True]
    assert train["margin"] == [2.0, 0.0, 0.0, 0.0]
    assert train["soft_label"] == [1.0, 0.8, 1.0, 1.0]
    assert train["group_id"] == [None, None, "7", None]
    assert splits.validation is None and splits.test is None


def test_a_soft_label_below_one_half_turns_the_pair_round(make_snapshot):
    row = {"prompt": "p", "chosen": " a", "rejected": " b", "soft_label": 0.2}
    train = load_preferences(make_snapshot(train=[row])).train
    assert (train[0]["chosen"], train[0]["rejected"]) == (" b", " a")
    assert train[0]["soft_label"] == pytest.approx(0.8)


def test_conversational_rows_and_optional_splits_load(make_snapshot):
    snapshot = make_snapshot(
        train=arithmetic_rows(3, conversational=True),
        validation=arithmetic_rows(2, seed=1, conversational=True),
        test=arithmetic_rows(2, seed=2, conversational=True),
    )
    splits = load_preferences(snapshot)
    assert [name for name, _ in splits.items()] == ["train", "validation", "test"]
    assert splits.train[0]["prompt"][0]["role"] == "user"
    assert splits.train[0]["chosen"][0]["role"] == "assistant"


def test_sft_from_preferences_uses_distinct_chosen_answers(make_snapshot):
    rows = arithmetic_rows(2)
    rows.append(dict(rows[0], rejected=" something else"))  # same winner, another loser
    train = load_sft(make_snapshot(train=rows)).train
    assert len(train) == 2
    assert train[0] == {"prompt": rows[0]["prompt"], "completion": rows[0]["chosen"]}


def test_sft_rows_pass_through(make_snapshot):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    splits = load_sft(make_snapshot(train=[{"messages": messages}]))
    assert splits.train[0]["messages"] == messages
    splits = load_sft(make_snapshot(train=[{"prompt": "1+1=", "completion": "2"}]))
    assert splits.train[0] == {"prompt": "1+1=", "completion": "2"}


def test_prompts_come_from_preference_rows_deduplicated(make_snapshot):
    rows = arithmetic_rows(3)
    rows.append(dict(rows[0]))
    prompts = load_prompts(make_snapshot(train=rows)).train
    assert prompts["prompt"] == [r["prompt"] for r in rows[:3]]


def test_implicit_prompt_pairs_yield_their_shared_prefix(make_snapshot):
    row = {
        "chosen": "\n\nHuman: Hi there\n\nAssistant: Hello!",
        "rejected": "\n\nHuman: Hi there\n\nAssistant: Go away.",
    }
    prompts = load_prompts(make_snapshot(train=[row])).train
    assert prompts[0]["prompt"] == "\n\nHuman: Hi there\n\nAssistant:"
    assert load_sft(make_snapshot(train=[row])).train[0] == {"text": row["chosen"]}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "x", "chosen": "a"', "not valid JSON"),
        ('{"foo": 1}', "expected keys"),
        ('{"prompt": "p", "chosen": 3, "rejected": "b"}', "must be a string"),
        ('{"prompt": "p", "chosen": "a", "rejected": "b", "soft_label": 2}', "soft_label"),
    ],
)
def test_bad_rows_are_reported_with_their_place(tmp_path, content, message):
    (tmp_path / "train.jsonl").write_text(content + "\n")
    with pytest.raises(DatasetError, match=message):
        load_preferences(tmp_path)


def test_missing_folder_or_train_split_is_a_dataset_error(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        load_preferences(tmp_path / "nope")
    with pytest.raises(DatasetError, match=r"train\.jsonl"):
        load_preferences(tmp_path)


def test_a_file_mixing_row_kinds_is_refused(make_snapshot):
    rows = [*arithmetic_rows(1), {"prompt": "only a prompt"}]
    with pytest.raises(DatasetError, match="not a preference row"):
        load_preferences(make_snapshot(train=rows))


def test_data_hash_covers_splits_but_not_the_manifest(make_snapshot):
    a = make_snapshot(train=arithmetic_rows(3))
    b = make_snapshot(train=arithmetic_rows(3), manifest={"policies": {"ties": "drop"}})
    c = make_snapshot(train=arithmetic_rows(3), validation=arithmetic_rows(1))
    assert data_hash(a) == data_hash(b) != data_hash(c)
    assert read_manifest(a) is None
    assert read_manifest(b)["content_hash"] == data_hash(b)
    (b / "train.jsonl").write_text(json.dumps(arithmetic_rows(1)[0]) + "\n")
    assert data_hash(b) != data_hash(a)


def test_a_row_mixing_text_and_messages_is_refused(make_snapshot):
    row = {"prompt": [{"role": "user", "content": "hi"}], "chosen": " a", "rejected": " b"}
    with pytest.raises(DatasetError, match="mix plain text and message lists"):
        load_preferences(make_snapshot(train=[row]))
