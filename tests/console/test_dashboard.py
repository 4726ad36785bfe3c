"""Evaluation dashboard: who may see it, what each panel computes, and CSV == chart numbers.

`build_evaluation_world` makes a realistic project (three policies, a reward model with stored
`evaluate_rm` metrics, two rounds labelled through the real serving services by five
annotators, one of them a left-clicker, a PPO run with a metrics.jsonl); the browser test
reuses it for the screenshot.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from annotation import services
from annotation.imports import content_hash
from annotation.models import (
    Candidate,
    Item,
    ItemCandidate,
    Judgment,
    Membership,
    Project,
    Prompt,
    Round,
)
from config.console.dashboard import data as loading
from config.console.dashboard.panel import Panel
from config.console.dashboard.specs import finite
from config.console.dashboard.tabs import annotators as annotators_tab
from config.console.dashboard.tabs import home as home_tab
from config.console.dashboard.tabs import labels as labels_tab
from config.console.dashboard.tabs import models as models_tab
from config.console.dashboard.tabs import reward_models as reward_tab
from config.console.dashboard.tabs import training as training_tab
from evaluation.services import qc_check_project
from tests.factories import add_member, make_project, make_user
from training.models import ModelVersion, TrainingRun
from training.rm_evaluation import rm_report

pytestmark = pytest.mark.django_db

# ---- a realistic world ---------------------------------------------------------------------


def _answer(a: int, b: int, quality: str, rng: random.Random) -> str:
    """Return an answer to "a + b" of the given quality (longer answers are not better)."""
    if quality == "good":
        return rng.choice(
            [
                f"{a} + {b} = {a + b}.",
                f"The sum is {a + b}.",
                f"{a + b}, since {a} + {b} = {a + b}.",
            ]
        )
    if quality == "verbose":
        return (
            f"Let me think step by step. We start with {a} and add {b}. Adding the ones and "
            f"then the tens gives {a + b}. So the answer is {a + b}, I believe."
        )
    wrong = a + b + rng.choice([-2, -1, 1, 3])
    return rng.choice([f"{a} + {b} = {wrong}.", f"I think it is {wrong}.", "I'm not sure."])


def _metrics_lines(steps: int, *, hacking: bool) -> list[dict]:
    """Return PPO-style metrics.jsonl records; with ``hacking`` KL and length explode late."""
    rng = np.random.default_rng(0)
    rows = []
    for step in range(1, steps + 1):
        late = max(0, step - steps * 0.6) / (steps * 0.4) if hacking else 0.0
        rows.append(
            {
                "step": step,
                "epoch": None,
                "time": "2026-01-01T00:00:00Z",
                "score/raw_mean": 0.2
                + 0.9 * (1 - math.exp(-step / 15))
                + 0.8 * late
                + rng.normal(0, 0.06),
                "kl/seq_mean": 0.05 * step + 14 * late**2 + abs(rng.normal(0, 0.05)),
                "entropy/rollout": 2.2 * math.exp(-step / 60) - 1.2 * late + rng.normal(0, 0.03),
                "response/length_mean": 18 + 2 * math.sin(step / 5) + 40 * late**2,
                "ppo/policy_loss": -0.02 + rng.normal(0, 0.01),
                "ppo/value_loss": 0.4 * math.exp(-step / 20) + 0.05 + abs(rng.normal(0, 0.01)),
            }
        )
    return rows


def _reward_model_metrics(seed: int = 0) -> dict:
    """Return a stored evaluate_rm report computed on synthetic scores (70%-ish accurate)."""
    rng = np.random.default_rng(seed)
    n = 400
    pairs = [
        {
            "prompt": f"prompt {i // 2}",
            "chosen": "x" * int(rng.integers(10, 80)),
            "rejected": "y" * int(rng.integers(10, 80)),
            "soft_label": 1.0,
        }
        for i in range(n)
    ]
    chosen = rng.normal(0.9, 1.4, n)
    rejected = rng.normal(0.0, 1.4, n)
    report = rm_report(pairs, chosen, rejected, seed=seed)
    report["data"] = {"file": "hh-harmless-test.jsonl.gz", "format": "hh"}
    return report


def build_evaluation_world(tmp_path: Path, *, items_per_round: int = 16, seed: int = 0):
    """Build a project worth a dashboard; return its people and rows."""
    rng = random.Random(seed)
    w = SimpleNamespace()
    w.project = make_project(name="Arithmetic helper", overlap=3, allow_tie=True)
    w.other = make_project(name="Someone else's project")
    w.staff = make_user("eval-staff", staff=True)
    w.researcher = make_user("eval-researcher")
    w.reviewer = make_user("eval-reviewer")
    w.other_researcher = make_user("eval-other-researcher")
    add_member(w.project, w.researcher, role=Membership.Role.RESEARCHER)
    add_member(w.project, w.reviewer, role=Membership.Role.REVIEWER)
    add_member(w.other, w.other_researcher, role=Membership.Role.RESEARCHER)
    w.annotators = [make_user(name) for name in ("ana", "ben", "chen", "dara", "eli")]
    for user in w.annotators:
        add_member(w.project, user)
    w.annotator = w.annotators[0]

    # Policies and a reward model, with what the loop stores on them.
    w.sft = ModelVersion.objects.create(
        name="sft-v0",
        artifact_path=str(tmp_path / "sft"),
        eval_results={
            "true_reward": 0.41,
            "true_reward_ci95": [0.35, 0.47],
            "accuracy": 0.32,
            "n_prompts": 64,
            "example": {"prompt": "What is 12 + 7?", "answer": "12 + 7 = 18."},
        },
    )
    w.rm_run = TrainingRun.objects.create(
        recipe="reward", project=w.project, status=TrainingRun.Status.SUCCEEDED, progress=1.0
    )
    w.reward_model = ModelVersion.objects.create(
        name="rm-r1",
        kind=ModelVersion.Kind.REWARD,
        artifact_path=str(tmp_path / "rm"),
        training_run=w.rm_run,
        eval_results={"eval_accuracy": 0.74, "rm_metrics": _reward_model_metrics()},
    )
    run_dir = tmp_path / "ppo-run"
    run_dir.mkdir()
    lines = _metrics_lines(80, hacking=True)
    lines.insert(10, {"event": "checkpoint", "step": 10, "path": "x"})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    w.run = TrainingRun.objects.create(
        recipe="ppo",
        project=w.project,
        status=TrainingRun.Status.SUCCEEDED,
        progress=1.0,
        output_dir=str(run_dir),
        finished_at=timezone.now(),
    )
    w.r1 = ModelVersion.objects.create(
        name="ppo-r1",
        parent=w.sft,
        training_run=w.run,
        artifact_path=str(run_dir / "final"),
        eval_results={
            "true_reward": 0.58,
            "true_reward_ci95": [0.52, 0.64],
            "accuracy": 0.51,
            "n_prompts": 64,
            "example": {"prompt": "What is 12 + 7?", "answer": "12 + 7 = 19."},
        },
    )
    w.r2 = ModelVersion.objects.create(
        name="ppo-r2",
        parent=w.r1,
        artifact_path=str(tmp_path / "r2"),
        eval_results={"true_reward": 0.63, "true_reward_ci95": [0.56, 0.70], "accuracy": 0.55},
    )
    # Newer policies answer correctly more often; r2 also got verbose (a length bias to see).
    quality = {
        w.sft: ("good", 0.45),
        w.r1: ("good", 0.7),
        w.r2: ("verbose", 0.78),
    }

    def make_round(number: int, version: ModelVersion, matchups: list[tuple]) -> Round:
        round_ = Round.objects.create(project=w.project, number=number, model_version=version)
        for i in range(items_per_round):
            a, b = rng.randint(3, 60), rng.randint(3, 60)
            text = f"What is {a} + {b}?"
            prompt, _ = Prompt.objects.get_or_create(
                project=w.project, content_hash=content_hash(text), defaults={"text": text}
            )
            models = list(matchups[i % len(matchups)])
            rng.shuffle(models)  # canonical positions do not favour anyone
            item = Item.objects.create(project=w.project, round=round_, prompt=prompt)
            for position, model in enumerate(models):
                style, p_good = quality[model]
                kind = style if rng.random() < p_good else "bad"
                answer = _answer(a, b, kind, rng)
                candidate, _ = Candidate.objects.get_or_create(
                    prompt=prompt,
                    content_hash=content_hash(answer),
                    model_name=model.name,
                    defaults={"text": answer, "policy_version": model},
                )
                ItemCandidate.objects.create(item=item, candidate=candidate, position=position)
        return round_

    def label_round(round_: Round) -> None:
        skill = {"ana": 0.9, "ben": 0.85, "chen": 0.8, "dara": 0.75, "eli": 0.5}
        active = list(w.annotators)
        while active:
            for user in list(active):
                assignment = services.assignment_next(project_id=w.project.pk, user=user, rng=rng)
                if assignment is None:
                    active.remove(user)
                    continue
                item = Item.objects.select_related("prompt").get(pk=assignment.item_id)
                texts = dict(item.slots.values_list("position", "candidate__text"))
                correct = [states_sum(item.prompt.text, texts[p]) for p in (0, 1)]
                roll = rng.random()
                if user.username == "eli" and roll < 0.85:
                    shown = "A"  # the left-clicker
                elif roll < 0.1:
                    shown = "tie"
                elif not correct[0] and not correct[1] and roll < 0.3:
                    shown = "both_bad"
                else:
                    if correct[0] != correct[1] and rng.random() < skill[user.username]:
                        winner = 0 if correct[0] else 1
                    elif len(texts[0]) != len(texts[1]) and rng.random() < 0.6:
                        winner = 0 if len(texts[0]) > len(texts[1]) else 1  # longer looks better
                    else:
                        winner = rng.randint(0, 1)
                    shown = "AB"[assignment.display_order.index(winner)]
                services.judgment_submit(
                    assignment_id=assignment.pk,
                    user=user,
                    choice=shown,
                    time_spent_ms=rng.randint(4_000, 40_000),
                )

    w.round1 = make_round(1, w.r1, [(w.r1, w.sft)])
    label_round(w.round1)
    Round.objects.filter(pk=w.round1.pk).update(status=Round.Status.CLOSED)
    w.round2 = make_round(2, w.r2, [(w.r2, w.r1), (w.r2, w.sft)])
    label_round(w.round2)
    # Half of round 3 is labelled: the progress chart has something in flight.
    w.round3 = make_round(3, w.r2, [(w.r2, w.r1)])
    for item in list(w.round3.items.all()[: items_per_round // 2]):
        Item.objects.filter(pk=item.pk).update(n_done=1, n_taken=1)
    Judgment.objects.filter(project=w.project, created_at__isnull=False).update(
        created_at=timezone.now() - timedelta(hours=1)
    )
    qc_check_project(project=w.project, pause=False, agreement=False)
    return w


def states_sum(prompt: str, answer: str) -> bool:
    """Return whether the last number in the answer is the sum the prompt asks for."""
    a, b = (int(n) for n in re.findall(r"\d+", prompt))
    numbers = re.findall(r"\d+", answer)
    return bool(numbers) and int(numbers[-1]) == a + b


@pytest.fixture(scope="module")
def world(django_db_setup, django_db_blocker, tmp_path_factory):
    """Build the world once per module, in a transaction rolled back at the end.

    Each test still runs in its own savepoint (pytest-django's ``db``), so what a test
    writes is undone before the next one.
    """
    with django_db_blocker.unblock(), transaction.atomic():
        yield build_evaluation_world(tmp_path_factory.mktemp("evaluation-world"))
        transaction.set_rollback(True)


def project_urls(w) -> dict[str, str]:
    pid = w.project.pk
    return {
        "home": reverse("dashboard:home"),
        "project": reverse("dashboard:project", args=[pid]),
        "models": reverse("dashboard:models", args=[pid]),
        "reward-models": reverse("dashboard:reward-models", args=[pid]),
        "training": reverse("dashboard:training", args=[pid]),
        "run": reverse("dashboard:run", args=[w.run.pk]),
    }


# ---- access --------------------------------------------------------------------------------


def _assert_csp_clean(html: str) -> None:
    """No inline script, no style attribute or element: the CSP would block them."""
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert "src=" in tag or 'type="application/json"' in tag, tag
    assert not re.search(r"\sstyle\s*=", html)
    assert "<style" not in html


@pytest.mark.parametrize("who", ["staff", "researcher"])
def test_every_page_renders_for_staff_and_project_researchers(client, world, who):
    client.force_login(getattr(world, who))
    for name, url in project_urls(world).items():
        response = client.get(url)
        assert response.status_code == 200, name
        html = response.content.decode()
        _assert_csp_clean(html)
        assert 'id="dashboard-charts"' in html
        assert "vendor/chart.umd.min.js" in html
        if name != "home":
            assert world.project.name in html


def test_pages_show_the_panels_researchers_need(client, world):
    client.force_login(world.researcher)
    urls = project_urls(world)
    labels = client.get(urls["project"]).content.decode()
    for title in (
        "Round progress",
        "Label distribution",
        "Position bias",
        "Inter-annotator agreement",
        "Annotator quality",
    ):
        assert title in labels
    models = client.get(urls["models"]).content.decode()
    for text in ("Leaderboard", "Win rates", "True reward", "Samples on the same prompts"):
        assert text in models
    assert "ppo-r2" in models and "sft-v0" in models
    reward = client.get(urls["reward-models"]).content.decode()
    assert "Calibration: rm-r1" in reward and "Reward margins: rm-r1" in reward
    training = client.get(urls["training"]).content.decode()
    assert "Training curves: run" in training
    assert "kl/seq_mean" in training  # the logged key behind each curve is named


def test_annotators_and_reviewers_get_403(client, world):
    for user in (world.annotator, world.reviewer):
        client.force_login(user)
        urls = project_urls(world)
        assert client.get(urls["home"]).status_code == 403
        for name in ("project", "models", "reward-models", "training", "run"):
            assert client.get(urls[name]).status_code == 403, (user, name)
            assert client.get(urls[name] + "?format=csv&chart=runs").status_code == 403


def test_researchers_of_other_projects_get_404_and_see_only_their_projects(client, world):
    client.force_login(world.other_researcher)
    urls = project_urls(world)
    for name in ("project", "models", "reward-models", "training", "run"):
        assert client.get(urls[name]).status_code == 404, name
    home = client.get(urls["home"])
    assert home.status_code == 200
    assert "Someone else" in home.content.decode()
    assert world.project.name not in home.content.decode()


def test_anonymous_users_are_sent_to_the_login_page(client, world):
    for url in project_urls(world).values():
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_admin_index_links_the_dashboard(client, world):
    client.force_login(world.staff)
    html = client.get(reverse("admin:index")).content.decode()
    assert reverse("dashboard:home") in html
    assert "Evaluation dashboard" in html


# ---- CSV == selector -----------------------------------------------------------------------


def _csv(response) -> list[list[str]]:
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    return list(csv.reader(io.StringIO(response.content.decode())))


def _expected_panels(w) -> dict[str, dict[str, Panel]]:
    data = loading.ProjectData(w.project)
    runs = data.runs
    curves, alarms = training_tab.curves_panel(w.run)
    return {
        "project": {
            "progress": labels_tab.round_progress_panel(data),
            "labels": labels_tab.label_distribution_panel(data),
            "position-bias": labels_tab.position_bias_panel(data),
            "agreement": annotators_tab.agreement_panel(data),
            "consensus": annotators_tab.annotator_agreement_panel(data),
            "annotators": annotators_tab.annotator_quality_panel(data),
        },
        "models": {
            "leaderboard": models_tab.leaderboard_panel(data),
            "winrates": models_tab.win_rate_panel(data),
            "true-reward": models_tab.true_reward_panel(data),
            "battles": models_tab.battle_counts_panel(data),
            "samples": models_tab.samples_panel(data),
        },
        "reward-models": {
            "reward-models": reward_tab.reward_model_table_panel(data.reward_models),
            "calibration": reward_tab.calibration_panel(w.reward_model),
            "margins": reward_tab.margin_panel(w.reward_model),
        },
        "training": {"runs": training_tab.runs_panel(runs), "curves": curves, "alarms": alarms},
    }


def test_every_chart_csv_returns_the_numbers_the_selector_computed(client, world):
    client.force_login(world.researcher)
    urls = project_urls(world)
    for page, panels in _expected_panels(world).items():
        for key, panel in panels.items():
            assert panel.status == "ok" and panel.rows, (page, key, panel.message)
            response = client.get(urls[page], {"format": "csv", "chart": key})
            rows = _csv(response)
            assert rows == list(csv.reader(io.StringIO(panel.as_csv()))), (page, key)
            assert rows[0] == panel.columns
            assert len(rows) == len(panel.rows) + 1


def test_chart_json_is_built_from_the_same_rows_as_the_csv(client, world):
    client.force_login(world.researcher)
    response = client.get(project_urls(world)["models"])
    charts = response.context["charts"]
    board = next(p for p in response.context["panels"] if p.key == "leaderboard")
    series = charts["leaderboard"]["series"][0]
    assert series["estimate"] == [row[2] for row in board.rows]
    assert series["low"] == [row[3] for row in board.rows]
    assert series["high"] == [row[4] for row in board.rows]
    html = response.content.decode()
    embedded = re.search(
        r'<script id="dashboard-charts" type="application/json">(.*?)</script>', html, re.S
    )
    assert json.loads(embedded.group(1))["leaderboard"]["labels"] == charts["leaderboard"]["labels"]


def test_unknown_chart_is_404(client, world):
    client.force_login(world.staff)
    url = project_urls(world)["models"]
    assert client.get(url, {"format": "csv", "chart": "nope"}).status_code == 404
    assert client.get(url, {"format": "csv"}).status_code == 404


# ---- what the panels compute ---------------------------------------------------------------


def test_battles_come_from_human_pairwise_judgments_between_different_models(world):
    data = loading.ProjectData(world.project)
    battles = data.battles
    judged = Judgment.objects.filter(
        project=world.project, source="human", is_gold=False, is_repeat=False, qc_flag=""
    ).count()
    assert len(battles) == judged  # every item pits two different models
    item = Item.objects.filter(round=world.round2).first()
    slots = {s.position: s.candidate.policy_version.name for s in item.slots.all()}
    for judgment in Judgment.objects.filter(item=item):
        assert any(
            b.model_a == slots[0] and b.model_b == slots[1] and b.outcome == judgment.choice
            for b in battles
        )


def test_win_rate_counts_are_the_raw_votes_from_the_newer_models_side(world):
    data = loading.ProjectData(world.project)
    panel = models_tab.win_rate_panel(data)
    row = next(r for r in panel.rows if (r[0], r[1]) == ("ppo-r1", "sft-v0"))
    wins = ties = losses = both_bad = 0
    for judgment in Judgment.objects.filter(item__round=world.round1).prefetch_related(
        "item__slots__candidate"
    ):
        models = {s.position: s.candidate.model_name for s in judgment.item.slots.all()}
        newer_at = 0 if models[0] == "ppo-r1" else 1
        if judgment.choice == "tie":
            ties += 1
        elif judgment.choice == "both_bad":
            both_bad += 1
        elif judgment.choice == "AB"[newer_at]:
            wins += 1
        else:
            losses += 1
    assert row[2] == "vs parent"
    assert row[3:7] == [wins, ties, losses, both_bad]
    assert row[8] == pytest.approx((wins + ties / 2) / (wins + ties + losses))
    assert row[9] <= row[8] <= row[10]
    assert row[11] == len(
        {j.item.prompt_id for j in Judgment.objects.filter(item__round=world.round1)}
    )


def test_leaderboard_ranks_every_model_with_an_interval(world):
    panel = models_tab.leaderboard_panel(loading.ProjectData(world.project))
    names = [row[1] for row in panel.rows]
    assert sorted(names) == ["ppo-r1", "ppo-r2", "sft-v0"]
    for row in panel.rows:
        assert row[3] <= row[2] <= row[4]
    assert np.mean([row[2] for row in panel.rows]) == pytest.approx(1000, abs=1e-6)


def test_position_bias_finds_the_left_clicker(world):
    panel = labels_tab.position_bias_panel(loading.ProjectData(world.project))
    by_scope = {row[0]: row for row in panel.rows}
    assert {"All rounds", "Round 1", "Round 2", "eli", "ana"} <= set(by_scope)
    eli = by_scope["eli"]
    assert eli[3] > 0.75 and eli[6] < 0.01  # left share, p-value
    assert eli[4] <= eli[3] <= eli[5]


def test_round_progress_counts_items_and_judgments(world):
    panel = labels_tab.round_progress_panel(loading.ProjectData(world.project))
    rows = {row[0]: row for row in panel.rows}
    assert rows[1][3:7] == [16, 16, 0, 0]  # items, complete, in progress, not started
    assert rows[1][7] == rows[1][8] == 48  # judgments done / needed (overlap 3)
    assert rows[3][4:7] == [0, 8, 8]
    assert rows[3][9] == pytest.approx(8 / 48)
    assert rows[2][10] == Judgment.objects.filter(item__round=world.round2).count()


def test_ranking_judgments_split_into_pairs():
    slots = {7: [(0, "x", 10), (1, "y", 20), (2, "z", 30)]}
    judgment = {
        "item_id": 7,
        "item__prompt_id": 3,
        "choice": "",
        "ranking": [2, 1, 2],
        "source": "human",
        "is_gold": False,
        "is_repeat": False,
    }
    battles = loading.pairwise_battles([judgment], slots)
    assert [(b.model_a, b.model_b, b.outcome) for b in battles] == [
        ("x", "y", "B"),
        ("x", "z", "tie"),
        ("y", "z", "A"),
    ]
    assert (battles[0].length_a, battles[0].length_b) == (10, 20)
    # Same model at two positions: no battle; gold, AI and QC-flagged labels: none either.
    assert loading.pairwise_battles([judgment], {7: [(0, "x", 1), (1, "x", 1), (2, "x", 1)]}) == []
    assert loading.pairwise_battles([{**judgment, "is_gold": True}], slots) == []
    assert loading.pairwise_battles([{**judgment, "source": "ai"}], slots) == []
    assert loading.pairwise_battles([{**judgment, "qc_flag": "too_fast"}], slots) == []


def test_training_curves_use_the_logged_keys_and_raise_alarms(world):
    curves, alarms = training_tab.curves_panel(world.run)
    metrics = {row[0]: row[1] for row in curves.rows}
    assert metrics == {
        "reward": "score/raw_mean",
        "kl": "kl/seq_mean",
        "entropy": "entropy/rollout",
        "response_length": "response/length_mean",
        "loss": "ppo/policy_loss",
        "value_loss": "ppo/value_loss",
    }
    steps = sorted({row[2] for row in curves.rows if row[0] == "reward"})
    assert steps == list(range(1, 81))  # the checkpoint event line is not a metric
    kinds = {row[1] for row in alarms.rows}
    assert "kl_limit" in kinds or "kl_superlinear" in kinds
    assert {a.kind for a in curves.chart.alarms} == kinds


def test_training_curves_of_a_quiet_run_raise_no_alarm(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in _metrics_lines(60, hacking=False))
    )
    run = TrainingRun.objects.create(recipe="ppo", output_dir=str(tmp_path))
    curves, alarms = training_tab.curves_panel(run)
    assert curves.status == "ok"
    assert alarms.status == "empty"
    missing = TrainingRun.objects.create(recipe="ppo", output_dir=str(tmp_path / "nothing"))
    assert training_tab.curves_panel(missing)[0].status == "empty"


def test_curves_are_thinned_to_a_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(training_tab, "MAX_CURVE_POINTS", 50)
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "loss": 1 / s}) + "\n" for s in range(1, 1001))
    )
    run = TrainingRun.objects.create(recipe="sft", output_dir=str(tmp_path))
    curves, _ = training_tab.curves_panel(run)
    steps = [row[2] for row in curves.rows]
    assert len(steps) == 50 and steps[0] == 1 and steps[-1] == 1000


def test_calibration_panel_reads_the_stored_evaluate_rm_report(world):
    panel = reward_tab.calibration_panel(world.reward_model)
    stored = world.reward_model.eval_results["rm_metrics"]["temperature"]
    names = [series.name for series in panel.chart.series]
    assert names[0] == "Held-out half, T = 1"
    assert names[1].startswith("Held-out half, T = ")
    after = [r for r in panel.rows if r[0] == names[1]]
    assert sum(r[5] for r in after) == stored["test_pairs"]
    margins = reward_tab.margin_panel(world.reward_model)
    assert sum(r[2] for r in margins.rows) == 400
    fresh = ModelVersion.objects.create(
        name="rm-new", kind=ModelVersion.Kind.REWARD, artifact_path="/x"
    )
    message = reward_tab.calibration_panel(fresh).message
    assert f"evaluate_rm --model-version {fresh.pk}" in message


def test_a_stored_report_of_another_shape_fails_loudly_instead_of_a_generic_table(client, world):
    # Given a stored agreement report, newer than every label, that lacks the figures the
    # agreement panel reads (say, written by an older release).
    from evaluation.models import AgreementReport

    AgreementReport.objects.create(
        project=world.project, report={"sources": ["human"]}, n_judgments=1
    )
    client.force_login(world.staff)
    # Then the Labels page raises: a panel never hides a broken selector behind a table.
    with pytest.raises(KeyError, match="by_source"):
        client.get(project_urls(world)["project"])


def test_round_filter_narrows_labels_to_one_round(client, world):
    client.force_login(world.researcher)
    response = client.get(project_urls(world)["project"], {"round": 1})
    assert response.status_code == 200
    data = response.context["data"]
    assert data.round == world.round1
    assert {j["item__round__number"] for j in data.judgments} == {1}
    csv_rows = _csv(
        client.get(project_urls(world)["project"], {"round": 1, "format": "csv", "chart": "labels"})
    )
    total = int(csv_rows[1][1])
    assert total == Judgment.objects.filter(item__round=world.round1, source="human").count()


def test_project_list_counts(world):
    panel = home_tab.project_overview_panel(projects=[world.project, world.other])
    row = next(r for r in panel.rows if r[0] == world.project.pk)
    assert row[3] == 3  # rounds
    assert row[4] == 48  # non-gold items
    assert row[5] == Judgment.objects.filter(project=world.project).count()
    assert row[6] == 2  # training runs
    assert loading.dashboard_projects(user=world.researcher) == [world.project]
    assert set(loading.dashboard_projects(user=world.staff)) >= {world.project, world.other}
    assert Project.objects.count() >= 2


def test_agreement_comes_from_a_stored_report_until_a_new_label_arrives(world):
    from evaluation.models import AgreementReport

    live = annotators_tab.agreement_panel(loading.ProjectData(world.project))
    report = json.loads(json.dumps(loading.ProjectData(world.project).agreement))
    report["by_source"]["human"]["alpha"]["estimate"] = 0.999  # a marker
    AgreementReport.objects.create(project=world.project, report=report, n_judgments=1)
    stored = annotators_tab.agreement_panel(loading.ProjectData(world.project))
    assert stored.rows[0][2] == 0.999
    assert stored.rows[1:] == live.rows[1:]
    newest = Judgment.objects.filter(project=world.project).order_by("-id").first()
    Judgment.objects.filter(pk=newest.pk).update(created_at=timezone.now() + timedelta(seconds=5))
    assert annotators_tab.agreement_panel(loading.ProjectData(world.project)).rows == live.rows


def test_ranking_projects_render_with_pairs_from_rankings(client):
    project = make_project(name="Rank three", task_kind="ranking", k=3, overlap=2)
    researcher = make_user("rank-researcher")
    add_member(project, researcher, role=Membership.Role.RESEARCHER)
    raters = [make_user(f"ranker{i}") for i in range(3)]
    for user in raters:
        add_member(project, user)
    versions = [
        ModelVersion.objects.create(name=f"rank-m{i}", artifact_path="/x") for i in range(3)
    ]
    round_ = Round.objects.create(project=project, number=1)
    for i in range(6):
        prompt = Prompt.objects.create(project=project, text=f"q{i}", content_hash=f"h{i}")
        item = Item.objects.create(project=project, round=round_, prompt=prompt)
        for position, version in enumerate(versions):
            candidate = Candidate.objects.create(
                prompt=prompt,
                text=f"answer {position} " * (position + 1),
                content_hash=f"c{i}-{position}",
                model_name=version.name,
                policy_version=version,
            )
            ItemCandidate.objects.create(item=item, candidate=candidate, position=position)
    rng = random.Random(1)
    for user in raters:
        while assignment := services.assignment_next(project_id=project.pk, user=user, rng=rng):
            ranks = [1, 2, 3]
            rng.shuffle(ranks)
            services.judgment_submit(assignment_id=assignment.pk, user=user, ranking=ranks)

    data = loading.ProjectData(project)
    n_rankings = Judgment.objects.filter(project=project).count()
    assert n_rankings == 12
    assert len(data.battles) == 3 * n_rankings  # K(K-1)/2 pairs per ranking
    bias = labels_tab.position_bias_panel(data)
    assert [row[0] for row in bias.rows] == ["Slot A", "Slot B", "Slot C"]
    assert sum(row[2] for row in bias.rows) == n_rankings
    assert bias.chart.reference == pytest.approx(1 / 3)
    board = models_tab.leaderboard_panel(data)
    assert "too narrow" in board.note
    client.force_login(researcher)
    for name in ("dashboard:project", "dashboard:models"):
        response = client.get(reverse(name, args=[project.pk]))
        assert response.status_code == 200
        _assert_csp_clean(response.content.decode())


def test_a_run_without_a_project_is_for_staff_only(client, world, tmp_path):
    run = TrainingRun.objects.create(recipe="sft", output_dir=str(tmp_path))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    url = reverse("dashboard:run", args=[run.pk])
    client.force_login(world.researcher)
    assert client.get(url).status_code == 404
    client.force_login(world.staff)
    response = client.get(url)
    assert response.status_code == 200
    assert "Training curves: run" in response.content.decode()


def test_chart_data_never_holds_nan():
    spec = finite({"a": [1.0, float("nan"), np.float64("inf")], "b": (np.float32(2.5),)})
    assert spec == {"a": [1.0, None, None], "b": [2.5]}
    json.dumps(spec, allow_nan=False)
