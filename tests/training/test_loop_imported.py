"""The loop starts from rounds imported without a policy, and refuses an endpoint policy as the
one to train, saying what to do instead."""

from __future__ import annotations

import io
import json

import pytest

from annotation.imports import items_import
from annotation.models import Judgment, Round
from tests.factories import add_pool_prompts, make_project, make_user
from training.loop import loop_advance
from training.loop.gate import policy_promote
from training.loop.settings import LoopSettings
from training.models import ModelVersion

pytestmark = pytest.mark.django_db


def _imported_round(project) -> Round:
    """Import a labelled round whose answers came from elsewhere (no policy version)."""
    rows = [
        {
            "prompt": f"What is {i} + {i + 2}?",
            "candidates": [{"text": f"It is {2 * i + 2}."}, {"text": f"No idea, {i}."}],
        }
        for i in range(8)
    ]
    round_ = Round.objects.create(project=project, number=1)
    items_import(
        project=project, stream=io.StringIO("\n".join(json.dumps(r) for r in rows)), round_=round_
    )
    annotator = make_user()
    for item in round_.items.all():
        Judgment.objects.create(project=project, item=item, annotator=annotator, choice="A")
    add_pool_prompts(project, train=8, eval=2)
    return round_


def _settings() -> LoopSettings:
    return LoopSettings(
        path="dpo",
        n_prompts=4,
        generation={"temperature": 1.0, "max_new_tokens": 6},
        dpo={"max_steps": 2, "per_device_train_batch_size": 2, "save_steps": 2},
        evaluation={"n_prompts": 2},
        gate={"kl_budget": None, "max_length_ratio": None},
    )


def test_an_imported_round_without_a_policy_says_what_the_loop_needs():
    project = make_project(overlap=1)
    _imported_round(project)
    state = loop_advance(project=project, settings=_settings(), sync=True)
    assert [(s.name, s.status) for s in state.steps] == [("start", "skipped")]
    assert "register the policy to train and promote it" in state.steps[0].detail


def test_an_imported_round_trains_the_promoted_registered_policy(
    settings, tmp_path, tiny_policy_dir
):
    settings.ARTIFACT_ROOT = tmp_path / "artifacts"
    project = make_project(overlap=1)
    _imported_round(project)
    registered = ModelVersion.objects.create(
        name=f"own-{project.pk}",
        artifact_path=str(tiny_policy_dir),
        project=project,
        source=ModelVersion.Source.FOLDER,
    )
    policy_promote(version=registered, user=make_user(staff=True), reason="our starting point")

    state = loop_advance(project=project, settings=_settings(), sync=True)

    steps = {s.name: s for s in state.steps}
    assert steps["dpo"].status == "done", state.steps
    new = ModelVersion.objects.get(training_run__project=project, training_run__recipe="dpo")
    assert new.parent == registered
    assert state.new_round is not None and state.new_round.items.exists()


def test_an_endpoint_policy_is_refused_as_the_one_to_train(settings):
    settings.PREFLOOP_GENERATION_ENDPOINTS = {
        "hosted": {"base_url": "http://127.0.0.1:9", "models": ["m"]}
    }
    project = make_project(overlap=1)
    round_ = _imported_round(project)
    endpoint = ModelVersion.objects.create(
        name=f"hosted-{project.pk}",
        kind=ModelVersion.Kind.ENDPOINT,
        artifact_path="",
        endpoint_name="hosted",
        endpoint_model="m",
        project=project,
        source=ModelVersion.Source.ENDPOINT,
    )
    Round.objects.filter(pk=round_.pk).update(model_version=endpoint)

    state = loop_advance(project=project, settings=_settings(), sync=True)

    assert [(s.name, s.status) for s in state.steps][-1] == ("train", "failed")
    assert "behind an endpoint, with no weights here to train" in state.steps[-1].detail
    assert not ModelVersion.objects.filter(training_run__project=project).exists()
