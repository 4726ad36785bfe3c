"""Round trip on real data: HH-RLHF in, HH-RLHF and TRL out, accepted by TRL's trainers."""

import gzip
import json
import os
from pathlib import Path

import pytest

from annotation.exports import dataset_version_export, dataset_version_load
from annotation.imports import preferences_import
from tests.factories import make_project

pytestmark = pytest.mark.django_db

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
HH_FILE = SHARED_DATA / "hh-harmless-dev.jsonl.gz"
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def hh_project(tmp_path, settings):
    if not HH_FILE.exists():
        pytest.skip("shared HH-RLHF sample is absent")
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project = make_project(max_text_chars=200_000)
    with gzip.open(HH_FILE, "rb") as fh:
        preferences_import(project=project, stream=fh, fmt="hh", batch="hh-dev")
    return project


def _file_pairs() -> list[tuple[str, str]]:
    with gzip.open(HH_FILE, "rt", encoding="utf-8") as fh:
        return sorted((row["chosen"], row["rejected"]) for row in map(json.loads, fh))


def test_hh_in_hh_out_gives_the_same_dialogues(hh_project):
    dv = dataset_version_export(
        project=hh_project,
        policy={"format": "hh", "sources": ["imported"], "split": {"train": 1.0}, "hf": False},
    )
    rows = dataset_version_load(dataset_version=dv)["train"]
    assert sorted((r["chosen"], r["rejected"]) for r in rows) == _file_pairs()


def test_imported_labels_need_to_be_named(hh_project):
    with pytest.raises(Exception, match="no training rows"):
        dataset_version_export(project=hh_project, policy={"hf": False})


def _tiny_models(tmp_path, rows):
    from training.trainers.tiny import (
        build_tiny_causal_lm,
        build_tiny_reward_model,
        train_tokenizer,
    )

    corpus = [m["content"] for r in rows for m in r["prompt"] + r["chosen"] + r["rejected"]]
    tokenizer = train_tokenizer(corpus, vocab_size=600)
    policy = build_tiny_causal_lm(tokenizer, tmp_path / "policy", n_layer=1, n_embd=32, n_head=2)
    reward = build_tiny_reward_model(tokenizer, tmp_path / "reward", n_layer=1, n_embd=32, n_head=2)
    return tokenizer, policy, reward


def test_trl_export_loads_in_datasets_and_feeds_reward_and_dpo_trainers(hh_project, tmp_path):
    import torch
    from datasets import load_dataset, load_from_disk
    from trl import DPOConfig, DPOTrainer, RewardConfig, RewardTrainer

    torch.set_num_threads(1)
    dv = dataset_version_export(
        project=hh_project, policy={"sources": ["imported"], "seed": 3}, name="hh trl"
    )
    folder = Path(dv.path)
    assert sum(dv.split_counts.values()) == 1189
    assert dv.report["conversational"] is True
    hf = load_from_disk(str(folder / "hf"))
    jsonl = load_dataset(
        "json",
        data_files={s: str(folder / f"{s}.jsonl") for s in hf},
        cache_dir=str(tmp_path / "cache"),
    )
    for split in hf:
        assert hf[split].to_list() == jsonl[split].to_list()
    assert set(hf["train"].column_names) == {
        "prompt",
        "chosen",
        "rejected",
        "margin",
        "soft_label",
        "group_id",
    }

    # The shortest few pairs keep the tiny models fast.
    def size(row):
        return sum(len(m["content"]) for m in row["prompt"] + row["chosen"] + row["rejected"])

    short = sorted(range(len(hf["train"])), key=lambda i: size(hf["train"][i]))[:8]
    train = hf["train"].select(short)
    tokenizer, policy_dir, reward_dir = _tiny_models(tmp_path, train.to_list())
    common = {
        "max_steps": 1,
        "per_device_train_batch_size": 2,
        "bf16": False,
        "use_cpu": True,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "max_length": 512,
    }
    reward = RewardTrainer(
        model=str(reward_dir),
        args=RewardConfig(output_dir=str(tmp_path / "rm"), **common),
        train_dataset=train,
        processing_class=tokenizer,
    )
    assert {"chosen_ids", "rejected_ids"} <= set(reward.train_dataset.column_names)
    assert reward.train().training_loss > 0
    dpo = DPOTrainer(
        model=str(policy_dir),
        args=DPOConfig(output_dir=str(tmp_path / "dpo"), **common),
        train_dataset=train.remove_columns(["margin", "soft_label", "group_id"]),
        processing_class=tokenizer,
    )
    assert {"prompt_ids", "chosen_ids", "rejected_ids"} <= set(dpo.train_dataset.column_names)
    assert dpo.train().training_loss > 0
