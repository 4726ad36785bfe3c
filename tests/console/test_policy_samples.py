"""What the reward model rewards: per-policy samples on the Models page, RM figures on its tab.

The policies are tiny GPT-2 models evaluated by the loop's real `policy_evaluate` (a base, a
promoted child and a grandchild, judged by a tiny reward model); the reward model's figures
come from the real `evaluate_rm` and `freeze_rm_normalisation` services.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil

import numpy as np
import pytest
from django.utils import timezone

from annotation.imports import content_hash
from annotation.models import Candidate, Membership, Prompt
from config.console.dashboard.tabs import policy_samples as samples_tab
from config.console.dashboard.tabs import reward_models as reward_tab
from evaluation.stats.textstats import text_stats
from tests.factories import add_member, make_project, make_round, make_user
from tests.training.conftest import (  # noqa: F401  (session fixtures: tiny tokenizer and models)
    tiny_policy_dir,
    tiny_reward_dir,
    tiny_tokenizer,
    tiny_tokenizer_dir,
)
from training import rm_evaluation
from training.loop.settings import LoopSettings
from training.models import ModelVersion, PolicyEvaluation, TrainingRun
from training.policy_eval import TIE_TOLERANCE, policy_evaluate
from training.scoring import reward_scores

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.filterwarnings("ignore:No directory at"),  # whitenoise, no collectstatic
]

N_EVAL = 6
SCRIPT_PROMPT = "What is <script>alert('prompt')</script> 2 + 2?"
SCRIPT_ANSWER = "<script>alert('answer')</script> 4"
POLICY_PANELS = (
    "policy-top-reward",
    "policy-top-kl",
    "policy-reward-kl",
    "policy-vs-previous",
    "policy-text-stats",
)


def _changed_copy(source, folder, seed: int):
    """Return a copy of a policy folder with its final layer norm moved (a 'trained' policy)."""
    import torch
    from transformers import AutoModelForCausalLM

    shutil.copytree(source, folder)
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    torch.manual_seed(seed)
    with torch.no_grad():
        model.transformer.ln_f.bias.add_(3.0 * torch.randn_like(model.transformer.ln_f.bias))
    model.save_pretrained(str(folder))
    return folder


def _settings() -> LoopSettings:
    return LoopSettings(
        path="dpo",
        prompt_source="pool",
        generation={"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8},
        evaluation={"n_prompts": N_EVAL, "seed": 3},
    )


@pytest.fixture
def lineage(tmp_path, tiny_policy_dir, tiny_reward_dir):  # noqa: F811
    """Base (round 1) -> promoted child -> grandchild, each evaluated by the loop's service."""
    project = make_project(name="samples project")
    texts = [SCRIPT_PROMPT] + [f"What is {i} + {i + 3}?" for i in range(N_EVAL - 1)]
    for text in texts:
        Prompt.objects.create(
            project=project, text=text, content_hash=content_hash(text), in_pool=True, split="eval"
        )
    base = ModelVersion.objects.create(
        name="base", artifact_path=str(tiny_policy_dir), project=project
    )
    round_ = make_round(project)
    round_.model_version = base
    round_.save(update_fields=["model_version"])
    child = ModelVersion.objects.create(
        name="child",
        artifact_path=str(_changed_copy(tiny_policy_dir, tmp_path / "child", 7)),
        parent=base,
        project=project,
    )
    run = TrainingRun.objects.create(recipe="reward", project=project, status="succeeded")
    reward = ModelVersion.objects.create(
        name="rm", kind="reward", artifact_path=str(tiny_reward_dir), training_run=run
    )
    settings = _settings()
    policy_evaluate(policy=child, project=project, settings=settings)
    child.promotion = ModelVersion.Promotion.PROMOTED
    child.promoted_at = timezone.now()
    child.save(update_fields=["promotion", "promoted_at"])
    grandchild = ModelVersion.objects.create(
        name="grandchild",
        artifact_path=str(_changed_copy(child.artifact_path, tmp_path / "grandchild", 8)),
        parent=child,
        project=project,
    )
    policy_evaluate(policy=grandchild, project=project, settings=settings)
    researcher = make_user("samples-researcher")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    return project, base, child, grandchild, reward, researcher


def _judge_row(policy: ModelVersion, opponent: ModelVersion) -> PolicyEvaluation:
    return PolicyEvaluation.objects.get(
        policy=policy, opponent=opponent, judge_kind=PolicyEvaluation.JudgeKind.REWARD_MODEL
    )


def _csv(response) -> list[dict[str, str]]:
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(response.content.decode())))


def _models_url(project) -> str:
    return f"/dashboard/projects/{project.pk}/models/"


def test_the_judge_keeps_each_answers_reward_model_score_and_the_previous_answers(lineage):
    _project, base, child, grandchild, reward, _ = lineage
    record = grandchild.eval_results["generation"]
    assert record["previous_id"] == child.pk and record["base_id"] == base.pk
    row = _judge_row(grandchild, child)
    details = row.details
    assert len(details["scores_new"]) == len(details["scores_old"]) == N_EVAL
    # The margins the gate reads are these scores' differences, and the outcomes follow them.
    assert details["margins"] == pytest.approx(
        [a - b for a, b in zip(details["scores_new"], details["scores_old"], strict=True)]
    )
    assert details["outcomes"] == [
        "tie" if abs(m) <= TIE_TOLERANCE else ("win" if m > 0 else "loss")
        for m in details["margins"]
    ]
    # The stored scores are the reward model's: score one answer again.
    top = int(np.argmax(details["scores_new"]))
    sample = record["samples"][top]
    again = reward_scores(reward.artifact_path, sample["prompt"], [sample["answer"]])[0]
    assert again == pytest.approx(details["scores_new"][top], rel=1e-4, abs=1e-5)
    # The opponents' answers are stored beside their statistics.
    for pk in (str(child.pk), str(base.pk)):
        answers = record["opponent_answers"][pk]
        assert len(answers) == N_EVAL
        assert text_stats(answers) == record["opponent_stats"][pk]


def test_policy_panels_rank_by_the_stored_reward_and_kl_and_pair_the_previous_answers(lineage):
    project, _base, child, grandchild, _reward, _ = lineage
    record = grandchild.eval_results["generation"]
    details = _judge_row(grandchild, child).details
    data = samples_tab.policy_samples(version=grandchild)
    assert data.previous == child and data.scored and data.judge.startswith("reward model")

    top = samples_tab.top_reward_panel(data)
    assert [r[1] for r in top.rows] == sorted(details["scores_new"], reverse=True)
    for number, reward, kl_ref, _kl_base, _prompt, answer in top.rows:
        assert answer == record["samples"][number - 1]["answer"]
        assert reward == details["scores_new"][number - 1]
        assert kl_ref == record["samples"][number - 1]["kl_reference"]
    assert len(top.extra["groups"]) == samples_tab.MAX_SHOWN

    by_kl = samples_tab.top_kl_panel(data)
    kls = [s["kl_reference"] for s in record["samples"]]
    assert all(v is not None for v in kls) and max(kls) > 0
    assert [r[2] for r in by_kl.rows] == sorted(kls, reverse=True)

    side = samples_tab.side_by_side_panel(data)
    previous = record["opponent_answers"][str(child.pk)]
    for number, _prompt, old, old_answer, old_reward, new, answer, _reward in side.rows:
        assert (old, new) == ("child", "grandchild")
        assert old_answer == previous[number - 1]
        assert old_reward == details["scores_old"][number - 1]
        assert answer == record["samples"][number - 1]["answer"]
    gains = [r[7] - r[4] for r in side.rows]
    assert gains == sorted(gains, reverse=True)

    # Both evaluated versions were judged by the same reward model: both are in the scatter.
    scatter = samples_tab.reward_kl_panel(data, samples_tab.evaluated_policies(project=project))
    assert {r[0] for r in scatter.rows} == {"child", "grandchild"}
    assert len(scatter.rows) == 2 * N_EVAL
    assert [s.name for s in scatter.chart.series] == ["grandchild", "child"]

    # Over versions: the base (answered only as an opponent), then child and grandchild.
    stats = samples_tab.text_stats_panel(samples_tab.evaluated_policies(project=project))
    assert [r[0] for r in stats.rows] == ["base", "child", "grandchild"]
    assert stats.rows[0][1] == "opponent only"
    assert stats.rows[2][4:] == [
        record["stats"]["distinct_1"],
        record["stats"]["distinct_2"],
        record["stats"]["repetition"],
    ]
    assert stats.chart.series[1].values == [r[5] for r in stats.rows]


def test_models_page_escapes_model_text_and_every_policy_csv_holds_the_panel_rows(client, lineage):
    project, _base, child, grandchild, _reward, researcher = lineage
    # A model can write HTML: the highest-scored answer now holds a script.
    row = _judge_row(grandchild, child)
    top = int(np.argmax(row.details["scores_new"]))
    results = grandchild.eval_results
    results["generation"]["samples"][top]["answer"] = SCRIPT_ANSWER
    grandchild.save(update_fields=["eval_results"])
    client.force_login(researcher)

    page = client.get(_models_url(project))

    assert page.status_code == 200
    html = page.content.decode()
    for key in POLICY_PANELS:
        assert f'id="panel-{key}"' in html, key
    assert 'name="policy"' in html
    assert "<script>alert(" not in html
    assert "&lt;script&gt;alert(&#x27;answer&#x27;)&lt;/script&gt;" in html
    assert "&lt;script&gt;alert(&#x27;prompt&#x27;)&lt;/script&gt;" in html
    block = re.search(
        r'<script id="dashboard-charts" type="application/json">(.*?)</script>', html, re.S
    )
    charts = json.loads(block.group(1))
    assert charts["policy-reward-kl"]["type"] == "scatter"
    assert charts["policy-text-stats"]["type"] == "lines"

    data = samples_tab.policy_samples(version=grandchild)
    expected = {
        "policy-top-reward": samples_tab.top_reward_panel(data),
        "policy-top-kl": samples_tab.top_kl_panel(data),
        "policy-vs-previous": samples_tab.side_by_side_panel(data),
    }
    for key, panel in expected.items():
        response = client.get(_models_url(project), {"format": "csv", "chart": key})
        assert response.content.decode() == panel.as_csv()
        rows = _csv(response)
        assert list(rows[0]) == panel.columns and len(rows) == N_EVAL
    top_rows = _csv(
        client.get(_models_url(project), {"format": "csv", "chart": "policy-top-reward"})
    )
    assert top_rows[0]["answer"] == SCRIPT_ANSWER  # data in the CSV, not markup
    scatter = _csv(client.get(_models_url(project), {"format": "csv", "chart": "policy-reward-kl"}))
    rewards = [float(r["reward"]) for r in scatter if r["policy"] == "grandchild"]
    assert rewards == pytest.approx(row.details["scores_new"])


def test_another_policy_is_picked_by_id_and_unknown_ids_are_refused(client, lineage):
    project, base, child, _grandchild, _reward, researcher = lineage
    client.force_login(researcher)

    page = client.get(_models_url(project), {"policy": child.pk})
    assert page.status_code == 200
    html = page.content.decode()
    assert "child next to the previous version" in html
    rows = _csv(
        client.get(
            _models_url(project),
            {"policy": child.pk, "format": "csv", "chart": "policy-vs-previous"},
        )
    )
    assert {r["previous policy"] for r in rows} == {"base"}

    other = make_project(name="other project")
    foreign = ModelVersion.objects.create(name="foreign-secret", artifact_path="/x", project=other)
    for value in (foreign.pk, base.pk, "abc"):  # another project's, never evaluated, not an id
        response = client.get(_models_url(project), {"policy": value})
        assert response.status_code == 404, value
        assert b"foreign-secret" not in response.content


def test_an_evaluation_stored_before_scores_were_kept_says_so(lineage):
    _project, _base, child, grandchild, _reward, _ = lineage
    for judge in PolicyEvaluation.objects.filter(policy=grandchild):
        judge.details = {k: v for k, v in judge.details.items() if not k.startswith("scores_")}
        judge.save(update_fields=["details"])
    data = samples_tab.policy_samples(version=grandchild)
    panel = samples_tab.top_reward_panel(data)
    assert panel.status == "empty" and "evaluate the policy again" in panel.message
    assert samples_tab.reward_kl_panel(data, [child, grandchild]).status == "empty"
    # KL and the previous answers do not depend on the scores.
    assert samples_tab.top_kl_panel(data).has_data
    side = samples_tab.side_by_side_panel(data)
    assert side.has_data and all(r[4] is None and r[7] is None for r in side.rows)


# ---- the Reward models tab ------------------------------------------------------------------


def _pairs(n: int = 24) -> list[dict]:
    """Return preference pairs whose answers grow in length, chosen = the right sum."""
    rows = []
    for i in range(n):
        question = f"What is {i} + {i}?"
        padding = " and so on" * (i % 8)
        rows.append(
            {
                "prompt": question,
                "chosen": f"It is {2 * i}.{padding}",
                "rejected": f"It is {2 * i + 1}, I think.{padding}",
                "soft_label": 1.0,
            }
        )
    return rows


@pytest.fixture
def evaluated_rm(tmp_path, tiny_reward_dir):  # noqa: F811
    """A reward model (an ensemble's folder) evaluated, calibrated and normalised for real."""
    project = make_project(name="rm project")
    folder = tmp_path / "rm"
    shutil.copytree(tiny_reward_dir, folder)
    run = TrainingRun.objects.create(recipe="reward", project=project, status="succeeded")
    version = ModelVersion.objects.create(
        name="rm-ensemble", kind="reward", artifact_path=str(folder), training_run=run
    )
    pairs = _pairs()
    report, _rendering = rm_evaluation.reward_model_evaluate(
        model_dir=folder, pairs=pairs, fmt="trl", seed=0
    )
    rm_evaluation.reward_model_evaluation_save(version=version, report=report)
    reference = ModelVersion.objects.create(name="sft-reference", artifact_path="/sft")
    for i, pair in enumerate(pairs[:8]):
        prompt = Prompt.objects.create(
            project=project, text=pair["prompt"], content_hash=content_hash(f"{i}")
        )
        Candidate.objects.create(
            prompt=prompt,
            text=pair["chosen"],
            content_hash=content_hash(pair["chosen"]),
            policy_version=reference,
        )
    normalisation = rm_evaluation.reward_model_normalisation_freeze(
        version=version, policy_version=reference
    )
    # As the reward recipe writes it beside a seed ensemble.
    (folder / reward_tab.ENSEMBLE_FILE).write_text(
        json.dumps({"size": 3, "seeds": [0, 1, 2], "validation_mean_std": 0.125})
    )
    version.refresh_from_db()
    return project, version, report, normalisation


def test_length_buckets_come_from_the_stored_report_with_intervals(evaluated_rm):
    _project, version, report, _ = evaluated_rm
    panel = reward_tab.length_bucket_panel(version)
    buckets = report["length_buckets"]
    assert [r[2] for r in panel.rows] == [b["n_pairs"] for b in buckets]
    assert sum(r[2] for r in panel.rows) == len(_pairs())
    for (low_len, high_len, _n, accuracy, low, high, longer), bucket in zip(
        panel.rows, buckets, strict=True
    ):
        assert (low_len, high_len, accuracy) == (
            bucket["lower"],
            bucket["upper"],
            bucket["accuracy"],
        )
        assert longer == bucket["longer_chosen_share"]
        assert low <= accuracy <= high
    assert panel.chart.reference == 0.5
    spearman = report["length_correlation"]["spearman"]
    assert f"Spearman {spearman:.3f}" in panel.note and "Singhal et al. 2023" in panel.note


def test_calibration_summary_shows_temperature_normalisation_and_ensemble_spread(evaluated_rm):
    _project, version, report, normalisation = evaluated_rm
    from training.trainers.reward import ENSEMBLE_FILE

    assert reward_tab.ENSEMBLE_FILE == ENSEMBLE_FILE
    rows = {r[0]: r for r in reward_tab.calibration_summary_panel(version).rows}
    assert rows["temperature T (applied by the scorer)"][1] == report["temperature"]["value"]
    assert rows["held-out ECE at T"][1] == report["temperature"]["test_ece_at_temperature"]
    assert rows["frozen normalisation: mean"][1] == normalisation["mean"]
    assert rows["frozen normalisation: std"][1] == normalisation["std"]
    assert rows["frozen normalisation: std"][2] == "8 answers of sft-reference"
    assert rows["ensemble members"][1:] == [3, "seeds 0, 1, 2"]
    assert rows["ensemble spread (mean std of a reward)"][1] == 0.125


def test_a_raw_single_reward_model_says_what_is_missing():
    version = ModelVersion.objects.create(name="raw-rm", kind="reward", artifact_path="/nowhere")
    panel = reward_tab.calibration_summary_panel(version)
    assert panel.status == "empty" and "freeze_rm_normalisation" in panel.message
    assert reward_tab.length_bucket_panel(version).status == "empty"


def test_a_fitted_temperature_the_scorer_does_not_apply_is_named_so(evaluated_rm):
    _project, version, report, _ = evaluated_rm
    # A report stored without going through evaluate_rm --save: nothing for the scorer.
    version.eval_results = {"rm_metrics": report}
    rows = {r[0]: r for r in reward_tab.calibration_summary_panel(version).rows}
    assert "temperature T (applied by the scorer)" not in rows
    assert rows["temperature T (fitted, not applied)"][1] == report["temperature"]["value"]


def test_reward_models_page_shows_the_new_panels_and_their_csv(client, evaluated_rm):
    project, _version, report, _ = evaluated_rm
    researcher = make_user("rm-researcher")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    client.force_login(researcher)
    url = f"/dashboard/projects/{project.pk}/reward-models/"

    html = client.get(url).content.decode()

    assert 'id="panel-length-buckets"' in html and 'id="panel-rm-calibration"' in html
    rows = _csv(client.get(url, {"format": "csv", "chart": "length-buckets"}))
    assert [int(r["pairs"]) for r in rows] == [b["n_pairs"] for b in report["length_buckets"]]
    summary = _csv(client.get(url, {"format": "csv", "chart": "rm-calibration"}))
    assert "ensemble members" in {r["quantity"] for r in summary}
