"""`manage.py evaluate_rm`: a tiny reward model built from a config scores HH and TRL files."""

from __future__ import annotations

import gzip
import io
import json
import random

import pytest
from django.core.management import CommandError, call_command

from config.console.dashboard.tabs import reward_models as reward_tab
from training.models import ModelVersion

METRIC_KEYS = {
    "n_pairs",
    "accuracy",
    "accuracy_ci95",
    "nll",
    "roc_auc",
    "ece",
    "reliability",
    "temperature",
    "margin_histogram",
    "margin",
    "length_correlation",
    "length_buckets",
    "reward_scale",
}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    import torch

    torch.set_num_threads(1)


def arithmetic_rows(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """Return (question, right answer, refusal) triples."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 30), rng.randint(0, 30)
        refusal = rng.choice(["I don't know.", "No idea.", "Ask someone else."])
        rows.append((f"What is {a} + {b}?", f"{a} + {b} = {a + b}.", refusal))
    return rows


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory):
    """Return a folder with a 2-layer GPT-2 reward model and a locally trained tokenizer."""
    from training.trainers.tiny import build_tiny_reward_model, train_tokenizer

    texts = [f"Q: {q}\nA: {c} {r}" for q, c, r in arithmetic_rows(300, seed=1)]
    tokenizer = train_tokenizer(texts, tmp_path_factory.mktemp("tok"), vocab_size=400)
    out = tmp_path_factory.mktemp("rm")
    return build_tiny_reward_model(tokenizer, out, n_layer=2, n_embd=32, n_head=2)


def write_jsonl(path, rows, *, gz: bool = False):
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    if gz:
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def run(*args) -> dict:
    out = io.StringIO()
    call_command("evaluate_rm", *args, stdout=out, stderr=io.StringIO())
    return json.loads(out.getvalue())


def test_trl_plain_text_file_gives_every_metric(reward_dir, tmp_path):
    rows = [
        {"prompt": f"Q: {q}\nA:", "chosen": f" {c}", "rejected": f" {r}"}
        for q, c, r in arithmetic_rows(40)
    ]
    path = write_jsonl(tmp_path / "pairs.jsonl.gz", [*rows, {"prompt": "only"}], gz=True)
    report = run("--path", str(reward_dir), "--file", str(path), "--limit", "30", "--seed", "3")

    assert set(report) >= METRIC_KEYS
    assert report["n_pairs"] == 30
    assert report["data"]["rows"] == 41
    assert report["data"]["skipped_reasons"] == {"needs 'chosen' and 'rejected'": 1}
    assert report["data"]["rendering"] == "as given"
    assert report["data"]["seed"] == 3 and report["data"]["limit"] == 30
    assert 0 <= report["accuracy"] <= 1
    low, high = report["accuracy_ci95"]
    assert low <= report["accuracy"] <= high
    assert 0 <= report["roc_auc"] <= 1 and report["nll"] > 0
    bins = report["reliability"]
    assert len(bins) == report["n_bins"] == 10
    assert sum(b["count"] for b in bins) == 30
    assert bins[3]["lower"] == 0.3  # edges are rounded for reading
    assert sum(report["margin_histogram"]["counts"]) == 30
    temperature = report["temperature"]
    assert temperature["value"] > 0
    assert temperature["validation_pairs"] + temperature["test_pairs"] == 30
    assert (
        sum(b["count"] for b in temperature["test_reliability_at_temperature"])
        == (temperature["test_pairs"])
    )
    assert {"spearman", "pearson"} <= set(report["length_correlation"])


def test_scores_are_the_reward_models_own(reward_dir, tmp_path):
    from training.trainers.reward import RewardScorer

    triples = arithmetic_rows(6, seed=5)
    rows = [
        {"prompt": f"Q: {q}\nA:", "chosen": f" {c}", "rejected": f" {r}"} for q, c, r in triples
    ]
    report = run("--path", str(reward_dir), "--file", str(write_jsonl(tmp_path / "p.jsonl", rows)))
    scorer = RewardScorer(reward_dir)
    prompts = [row["prompt"] for row in rows]
    chosen = scorer.score(prompts, [row["chosen"] for row in rows])
    rejected = scorer.score(prompts, [row["rejected"] for row in rows])
    wins = sum(c > r for c, r in zip(chosen, rejected, strict=True)) / len(rows)
    assert report["accuracy"] == pytest.approx(wins)
    mean = sum(chosen + rejected) / (2 * len(rows))
    assert report["reward_scale"]["mean"] == pytest.approx(mean, rel=1e-4, abs=1e-6)


def test_hh_dialogues_and_conversational_trl_go_through_the_chat_template(reward_dir, tmp_path):
    triples = arithmetic_rows(12, seed=2)
    hh = [
        {
            "chosen": f"\n\nHuman: {q}\n\nAssistant: {c}",
            "rejected": f"\n\nHuman: {q}\n\nAssistant: {r}",
        }
        for q, c, r in triples
    ]
    report = run(
        "--path", str(reward_dir), "--file", str(write_jsonl(tmp_path / "hh.jsonl", hh)),
        "--format", "hh",
    )  # fmt: skip
    assert report["n_pairs"] == 12 and report["data"]["rendering"] == "chat template"
    conversational = [
        {
            "prompt": [{"role": "user", "content": q}],
            "chosen": [{"role": "assistant", "content": c}],
            "rejected": [{"role": "assistant", "content": r}],
        }
        for q, c, r in triples
    ]
    path = write_jsonl(tmp_path / "conv.jsonl", conversational)
    same = run("--path", str(reward_dir), "--file", str(path))
    # The same dialogues, the same template: the same scores.
    assert same["accuracy"] == report["accuracy"]
    assert same["reward_scale"] == pytest.approx(report["reward_scale"])
    plain = run(
        "--path", str(reward_dir), "--file", str(tmp_path / "hh.jsonl"), "--format", "hh",
        "--render", "plain",
    )  # fmt: skip
    assert plain["data"]["rendering"] == "plain dialogue"
    assert plain["reward_scale"] != same["reward_scale"]


@pytest.mark.django_db
def test_save_stores_the_report_for_the_dashboard(reward_dir, tmp_path):
    version = ModelVersion.objects.create(
        name="rm-tiny",
        kind=ModelVersion.Kind.REWARD,
        artifact_path=str(reward_dir),
        eval_results={"eval_accuracy": 0.8},
    )
    rows = [
        {"prompt": f"Q: {q}\nA:", "chosen": f" {c}", "rejected": f" {r}"}
        for q, c, r in arithmetic_rows(24)
    ]
    path = write_jsonl(tmp_path / "pairs.jsonl", rows)
    report = run("--model-version", str(version.pk), "--file", str(path), "--save")
    assert report["model"] == {"id": version.pk, "name": "rm-tiny", "path": str(reward_dir)}
    version.refresh_from_db()
    assert version.eval_results["eval_accuracy"] == 0.8  # kept
    assert version.eval_results["rm_metrics"] == report
    calibration = reward_tab.calibration_panel(version)
    assert calibration.status == "ok"
    assert sum(row[5] for row in calibration.rows) == 2 * report["temperature"]["test_pairs"]
    table = reward_tab.reward_model_table_panel([version])
    assert table.rows[0][4] == report["accuracy"]


@pytest.mark.django_db
def test_refuses_what_it_cannot_score(reward_dir, tmp_path):
    policy = ModelVersion.objects.create(name="a-policy", artifact_path=str(reward_dir))
    good = write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "b"}] * 3)
    with pytest.raises(CommandError, match="is a policy model"):
        run("--model-version", str(policy.pk), "--file", str(good))
    with pytest.raises(CommandError, match="no model version"):
        run("--model-version", "999999", "--file", str(good))
    with pytest.raises(CommandError, match="needs --model-version"):
        run("--path", str(reward_dir), "--file", str(good), "--save")
    with pytest.raises(CommandError, match="no such file"):
        run("--path", str(reward_dir), "--file", str(tmp_path / "missing.jsonl"))
    with pytest.raises(CommandError, match="model folder not found"):
        run("--path", str(tmp_path / "nothing"), "--file", str(good))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"chosen": "no dialogue", "rejected": "x"}])
    with pytest.raises(CommandError, match="0 usable pair"):
        run("--path", str(reward_dir), "--file", str(bad), "--format", "hh")
