"""Dashboard live parts and training charts: the polled panels (runs, progress, QC state)
answer alone and show new rows, the curves chart what DPO and PPO really log, and alarms
are raised only where they fit the recipe."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from django.urls import reverse

from annotation.models import Judgment, Membership
from config.console.dashboard.tabs import training as training_tab
from evaluation.services import annotator_pause
from tests.factories import add_member, make_items, make_project, make_user
from tests.training.conftest import (  # noqa: F401  (session fixtures: tiny tokenizer, policy)
    arithmetic_rows,
    make_snapshot,
    tiny_policy_dir,
    tiny_tokenizer,
    tiny_tokenizer_dir,
)
from training.models import TrainingRun

pytestmark = pytest.mark.django_db


@pytest.fixture
def project_world():
    project = make_project()
    researcher, annotator = make_user(), make_user()
    add_member(project, researcher, Membership.Role.RESEARCHER)
    add_member(project, annotator)
    return project, researcher, annotator


def _live_urls(html: str) -> dict[str, str]:
    """Return panel key -> the URL htmx polls, from a rendered page."""
    found = re.findall(r'id="panel-([\w-]+)"[^>]*\bhx-get="([^"]+)"', html)
    return {key: url.replace("&amp;", "&") for key, url in found}


def test_the_labels_page_polls_progress_and_qc_state_and_they_follow_new_rows(
    client, project_world
):
    project, researcher, annotator = project_world
    items = make_items(project, 3)
    client.force_login(researcher)
    page = client.get(reverse("dashboard:project", args=[project.pk])).content.decode()
    live = _live_urls(page)
    assert set(live) == {"progress", "annotators"}
    assert all("every 5s" in page for _ in live)

    # a label comes in: the polled progress panel counts it without a page reload
    before = client.get(live["progress"])
    assert before.status_code == 200
    fragment = before.content.decode()
    assert fragment.lstrip().startswith('<section class="panel') and "<html" not in fragment
    Judgment.objects.create(project=project, item=items[0], annotator=annotator, choice="A")
    after = client.get(live["progress"]).content.decode()
    assert after != fragment

    # QC pauses the annotator: the polled annotators panel shows it
    annotators = client.get(live["annotators"]).content.decode()
    assert "paused" not in annotators
    annotator_pause(
        project=project, annotator_id=annotator.pk, failed_checks=["gold"], reasons=["gold"]
    )
    annotators = client.get(live["annotators"]).content.decode()
    assert "paused" in annotators and 'hx-trigger="every 5s"' in annotators


def test_only_live_panels_answer_alone_and_only_to_the_projects_researchers(client, project_world):
    project, researcher, annotator = project_world
    url = reverse("dashboard:project", args=[project.pk])
    client.force_login(researcher)
    assert client.get(url, {"panel": "labels"}).status_code == 404  # not a live panel
    assert client.get(url, {"panel": "nope"}).status_code == 404
    client.force_login(annotator)
    assert client.get(url, {"panel": "progress"}).status_code == 403
    stranger = make_user()
    add_member(make_project(), stranger, Membership.Role.RESEARCHER)
    client.force_login(stranger)
    assert client.get(url, {"panel": "progress"}).status_code == 404


def test_the_training_page_polls_the_runs_and_a_running_runs_curves(
    client, project_world, tmp_path
):
    project, researcher, _annotator = project_world
    run = TrainingRun.objects.create(
        recipe="ppo", project=project, status="running", output_dir=str(tmp_path)
    )
    _write_metrics(tmp_path, [{"step": 1, "loss": 1.0, "ppo/clip_fraction": 0.1}])
    client.force_login(researcher)
    page = client.get(reverse("dashboard:training", args=[project.pk])).content.decode()
    live = _live_urls(page)
    assert set(live) == {"runs", "curves", "alarms"}
    assert "running" in client.get(live["runs"]).content.decode()

    # progress moves and a metric is logged: the polled panels show both
    TrainingRun.objects.filter(pk=run.pk).update(progress=0.5)
    assert "0.500" in client.get(live["runs"]).content.decode()
    _write_metrics(tmp_path, [{"step": 2, "loss": 0.5, "ppo/clip_fraction": 0.2}], append=True)
    curves = client.get(live["curves"]).content.decode()
    spec = json.loads(html.unescape(re.search(r'data-chart-spec="([^"]*)"', curves).group(1)))
    clip = next(c for c in spec["charts"] if c["metric"] == "clip_fraction")
    assert [p[0] for p in clip["points"]] == [1, 2]

    # once the run is over, its curves stop refreshing; the runs list still does
    TrainingRun.objects.filter(pk=run.pk).update(status="succeeded", progress=1.0)
    page = client.get(reverse("dashboard:training", args=[project.pk])).content.decode()
    assert set(_live_urls(page)) == {"runs"}


def _write_metrics(folder: Path, records: list[dict], append: bool = False) -> None:
    with (folder / "metrics.jsonl").open("a" if append else "w") as fh:
        for record in records:
            fh.write(json.dumps(record) + "\n")


def _logged_keys(folder: Path) -> set[str]:
    keys = set()
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "event" not in record:
            keys |= {k for k, v in record.items() if isinstance(v, int | float)}
    return keys


def _charted(run: TrainingRun) -> dict[str, str]:
    curves, _alarms = training_tab.curves_panel(run)
    assert curves.status == "ok"
    return {curve.metric: curve.source for curve in curves.chart.charts}


def test_dpo_curves_chart_the_implicit_rewards_a_real_dpo_run_logs(
    tmp_path,
    tiny_policy_dir,  # noqa: F811
    make_snapshot,  # noqa: F811
):
    from training.trainers import dpo

    snapshot = make_snapshot(train=arithmetic_rows(32), validation=arithmetic_rows(8, seed=1))
    out = tmp_path / "dpo"
    config = dpo.Config(
        model_name_or_path=str(tiny_policy_dir),
        max_steps=4,
        logging_steps=1,
        save_steps=100,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        learning_rate=1e-3,
    )
    dpo.train(config, snapshot, out, None)
    run = TrainingRun.objects.create(recipe="dpo", status="succeeded", output_dir=str(out))

    charted = _charted(run)
    logged = _logged_keys(out)
    assert set(charted.values()) <= logged  # every curve reads a key the run wrote
    for metric, key in {
        "rewards_chosen": "rewards/chosen",
        "rewards_rejected": "rewards/rejected",
        "rewards_margins": "rewards/margins",
        "rewards_accuracies": "rewards/accuracies",
        "loss": "loss",
        "grad_norm": "grad_norm",
    }.items():
        assert key in logged and charted.get(metric) == key, metric


def test_ppo_curves_chart_the_update_size_a_real_ppo_run_logs(
    tmp_path,
    tiny_policy_dir,  # noqa: F811
    make_snapshot,  # noqa: F811
):
    from training import demo
    from training.trainers import ppo
    from training.trainers.run_log import RunLogger

    chat = [[{"role": "user", "content": p.prompt}] for p in demo.problems_in("train")[:8]]
    snapshot = make_snapshot(train=[{"prompt": p} for p in chat])
    out = tmp_path / "ppo"
    config = ppo.Config(
        model_name_or_path=str(tiny_policy_dir),
        reward_function="training.demo:true_reward",
        prompt_format="chat",
        rollout_batch_size=8,
        per_device_train_batch_size=4,
        max_new_tokens=8,
        max_steps=2,
        num_ppo_epochs=1,
        num_sample_prompts=2,
        save_steps=1000,
        evaluate_at_end=False,
    )
    ppo.train(config, snapshot, out, RunLogger(out, echo=False))
    run = TrainingRun.objects.create(recipe="ppo", status="succeeded", output_dir=str(out))

    charted = _charted(run)
    logged = _logged_keys(out)
    assert set(charted.values()) <= logged
    for metric, key in {
        "clip_fraction": "ppo/clip_fraction",
        "approx_kl": "ppo/approx_kl",
        "grad_norm": "ppo/policy_grad_norm",
        "value_grad_norm": "ppo/value_grad_norm",
        "reward": "score/raw_mean",
        "kl": "kl/seq_mean",
        "entropy": "entropy/rollout",
        "value_loss": "ppo/value_loss",
    }.items():
        assert key in logged and charted.get(metric) == key, metric


def _collapsing_entropy(entropy_key: str) -> list[dict]:
    """Return 60 logs whose entropy falls to a tenth while the loss falls (an SFT's shape)."""
    return [
        {"step": step, "loss": 2.0 - step / 40, entropy_key: 3.0 * (0.96**step)}
        for step in range(1, 61)
    ]


@pytest.mark.parametrize(
    ("recipe", "key", "alarmed"),
    [("sft", "entropy", False), ("dpo", "entropy", False), ("ppo", "entropy/rollout", True)],
)
def test_entropy_collapse_is_an_alarm_only_for_recipes_that_sample(tmp_path, recipe, key, alarmed):
    # a run that ended before its supervisor stored alarms: the same rules run here, once
    _write_metrics(tmp_path, _collapsing_entropy(key))
    run = TrainingRun.objects.create(recipe=recipe, status="succeeded", output_dir=str(tmp_path))
    curves, alarms = training_tab.curves_panel(run)
    kinds = {row[1] for row in alarms.rows}
    assert ("entropy_collapse" in kinds) is alarmed
    assert ({a.kind for a in curves.chart.alarms} == kinds) or not alarmed
    assert "§" not in curves.note and "et al." in curves.note


def test_a_running_run_shows_the_alarms_its_supervisor_stored(tmp_path):
    _write_metrics(tmp_path, _collapsing_entropy("entropy/rollout"))
    stored = {"step": 7, "kind": "kl_limit", "reason": "KL 9 above 6", "action": "stopped"}
    run = TrainingRun.objects.create(
        recipe="ppo", status="running", output_dir=str(tmp_path), alarms=[stored]
    )
    curves, alarms = training_tab.curves_panel(run)
    assert alarms.rows == [[7, "kl_limit", "KL 9 above 6", "stopped"]]
    assert [(a.step, a.kind) for a in curves.chart.alarms] == [(7, "kl_limit")]
