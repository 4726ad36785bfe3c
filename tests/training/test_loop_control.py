"""A project's loop record: settings validated by field, no demo defaults, every tick recorded.

The loop's settings and pause flag live on its `training.Loop` row; every tick goes through
`control.loop_tick_run`, which stores the outcome there and each step as a `LoopEvent`. A tick
that raises (here: the policy's folder was removed before its round was generated) is stored
with its error and re-raised, never lost.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from annotation.errors import Conflict, NotFound
from annotation.imports import content_hash
from annotation.models import DatasetVersion, Judgment, Membership, Prompt, Round
from tests.factories import add_member, make_items, make_project, make_tiny_demo_policy, make_user
from training import loop
from training.loop import control
from training.loop.timeline import loop_timeline
from training.models import Loop, LoopEvent, ModelVersion, TrainingRun

pytestmark = pytest.mark.django_db


def pool_prompts(project, n: int) -> list[str]:
    texts = [f"Pool question {project.pk}-{i}?" for i in range(n)]
    for text in texts:
        Prompt.objects.create(
            project=project, text=text, content_hash=content_hash(text), in_pool=True
        )
    return texts


# --------------------------------------------------------------------------- no demo defaults


def test_settings_default_to_a_real_project_not_the_demo():
    settings = loop.LoopSettings(path="dpo")

    assert settings.prompt_source == "pool"
    assert settings.sources == ["human"]
    with pytest.raises(TypeError, match="path"):
        loop.LoopSettings()
    with pytest.raises(ValueError, match="path must be chosen"):
        loop.LoopSettings.from_dict({"n_prompts": 8})


def test_a_loop_without_a_path_is_refused_naming_it_and_nothing_is_saved():
    project = make_project()

    with pytest.raises(control.InvalidLoopSettings) as refused:
        control.loop_create(project=project, settings={"n_prompts": 8})

    assert refused.value.field == "path"
    assert refused.value.status == 400
    assert not Loop.objects.filter(project=project).exists()


def test_a_saved_loop_keeps_the_real_defaults_and_only_the_project_id_on_its_schedule():
    from django_celery_beat.models import PeriodicTask

    project = make_project()
    found = control.loop_create(project=project, settings={"path": "rm_ppo"}, every_seconds=60)

    assert found.config["path"] == "rm_ppo"
    assert found.config["prompt_source"] == "pool"
    assert found.config["sources"] == ["human"]
    task = PeriodicTask.objects.get(name=f"prefloop-loop-{project.pk}")
    assert json.loads(task.kwargs) == {"project_id": project.pk}
    # A second loop for the project is a conflict; an update changes only what it names.
    with pytest.raises(Conflict):
        control.loop_create(project=project, settings={"path": "dpo"})
    updated = control.loop_update(project=project, settings={"n_prompts": 16})
    assert updated.config["path"] == "rm_ppo"
    assert updated.config["n_prompts"] == 16


@pytest.mark.parametrize(
    "values, field",
    [
        ({"path": "ppo"}, "path"),
        ({"path": "dpo", "n_prompts": 0}, "n_prompts"),
        ({"path": "dpo", "k": "2"}, "k"),
        ({"path": "dpo", "sources": ["robots"]}, "sources"),
        ({"path": "dpo", "sources": []}, "sources"),
        ({"path": "dpo", "prompt_source": "web"}, "prompt_source"),
        ({"path": "dpo", "aggregation": "vibes"}, "aggregation"),
        ({"path": "dpo", "random_share": 2.0}, "random_share"),
        ({"path": "dpo", "train_rounds": "latest"}, "train_rounds"),
        ({"path": "dpo", "hard_mining": "margin"}, "hard_mining"),
        ({"path": "dpo", "generation": {"temprature": 0.7}}, "generation.temprature"),
        ({"path": "dpo", "generation": {"seed": 3}}, "generation.seed"),
        ({"path": "dpo", "dpo": {"trl_args": {"output_dir": "/tmp/x"}}}, "dpo.trl_args.output_dir"),
        ({"path": "dpo", "nonsense": 1}, "nonsense"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(values, field):
    project = make_project()

    with pytest.raises(control.InvalidLoopSettings) as refused:
        control.loop_update(project=project, settings=values)

    assert refused.value.field == field
    assert refused.value.message.startswith(f"{field}:")
    assert not Loop.objects.filter(project=project).exists()


def test_a_researcher_names_models_by_ids_of_the_project_never_by_path(tmp_path):
    project, other = make_project(), make_project()
    researcher = make_user()
    add_member(project, researcher, Membership.Role.RESEARCHER)
    theirs = ModelVersion.objects.create(
        name="other-rm", kind="reward", artifact_path=str(tmp_path), project=other
    )
    ours = ModelVersion.objects.create(
        name="our-rm", kind="reward", artifact_path=str(tmp_path), project=project
    )

    with pytest.raises(control.InvalidLoopSettings) as refused:
        control.loop_update(
            project=project,
            user=researcher,
            settings={"path": "rm_ppo", "reward": {"model_name_or_path": str(tmp_path)}},
        )
    assert refused.value.field == "reward.model_name_or_path"
    with pytest.raises(NotFound, match=r"ppo\.reward_model_id"):
        control.loop_update(
            project=project,
            user=researcher,
            settings={"path": "rm_ppo", "ppo": {"reward_model_id": theirs.pk}},
        )
    assert not Loop.objects.filter(project=project).exists()

    saved = control.loop_update(
        project=project,
        user=researcher,
        settings={"path": "rm_ppo", "ppo": {"reward_model_id": ours.pk}},
    )
    assert saved.config["ppo"] == {"reward_model_id": ours.pk}


# --------------------------------------------------------------------------- ticks recorded


def test_a_tick_that_raises_is_recorded_on_the_loop_and_re_raised(tmp_path):
    # Given a round the loop opened from a policy whose folder was then removed
    project = make_project(k=2, overlap=1)
    pool_prompts(project, 4)
    policy = make_tiny_demo_policy(tmp_path / "policy", name="gone-policy", n_positions=32)
    learned_from = Round.objects.create(project=project, number=1, model_version=policy)
    make_items(project, 2, round_=learned_from)
    Round.objects.create(
        project=project,
        number=2,
        model_version=policy,
        source_key=f"{loop.loop_key(learned_from)}:gen",
    )
    shutil.rmtree(tmp_path / "policy")
    control.loop_create(project=project, settings={"path": "dpo", "n_prompts": 2})

    # When a tick tries to generate that round, it fails
    with pytest.raises(Exception) as raised:
        control.loop_tick_run(project_id=project.pk, sync=True)

    # Then the failure is on the loop row, with its error, and as a failed tick event
    found = Loop.objects.get(project=project)
    assert found.last_tick_status == "failed"
    assert type(raised.value).__name__ in found.last_error
    assert "Traceback" in found.last_error
    # researchers read it: no server path, neither the policy's folder nor our source files
    assert str(tmp_path) not in found.last_error and "<server path>" in found.last_error
    assert str(Path(control.__file__).parent) not in found.last_error
    assert found.last_tick_at is not None
    event = LoopEvent.objects.get(loop=found, step="tick")
    assert event.status == "failed"
    assert event.key == f"loop-{project.pk}-r2"
    assert str(tmp_path) not in event.detail  # server paths are not shown
    # and the timeline shows it
    timeline = loop_timeline(project=project)
    assert timeline.last_tick_status == "failed"
    assert timeline.events[0].step == "tick"


def label_all(project, round_) -> None:
    annotator = make_user()
    for i, item in enumerate(round_.items.all()):
        Judgment.objects.create(
            project=project, item=item, annotator=annotator, choice="A" if i % 2 else "B"
        )


def test_each_step_of_a_tick_is_an_event_with_its_duration_and_its_rows(tmp_path):
    # Given a labelled round from a registered policy
    project = make_project(k=2, overlap=1)
    policy = make_tiny_demo_policy(tmp_path / "policy", name="base-policy", n_positions=32)
    round1 = Round.objects.create(project=project, number=1, model_version=policy)
    make_items(project, 12, round_=round1)
    label_all(project, round1)
    control.loop_create(project=project, settings={"path": "dpo", "n_prompts": 4})

    # When the loop ticks (training is queued, not run here)
    state = control.loop_tick_run(project_id=project.pk)

    # Then the export and the queued DPO run are events linked to their rows
    key = f"loop-{project.pk}-r1"
    assert state.key == key
    run = TrainingRun.objects.get(project=project, recipe="dpo")
    events = {e.step: e for e in LoopEvent.objects.filter(loop__project=project, key=key)}
    assert {"export", "dpo"} <= set(events)
    assert events["dpo"].status == "waiting"
    assert events["dpo"].training_run_id == run.pk
    assert events["export"].round_id == round1.pk
    for event in events.values():
        assert event.duration_seconds is not None and event.duration_seconds >= 0
        assert event.finished_at >= event.started_at
    found = Loop.objects.get(project=project)
    assert found.last_tick_status == "done"
    assert [s["name"] for s in found.last_steps] == [s.name for s in state.steps]

    # and the timeline reads round -> dataset -> run, with the run's progress
    TrainingRun.objects.filter(pk=run.pk).update(status="running", progress=0.25)
    iteration = loop_timeline(project=project).iterations[0]
    kinds = [step.kind for step in iteration.steps]
    assert kinds[:3] == ["round", "export", "train"]
    round_step, export_step, train_step = iteration.steps[:3]
    assert round_step.progress == 1.0
    assert export_step.status == "ready"
    assert train_step.run_id == run.pk
    assert train_step.progress == 0.25
    assert train_step.active


def test_a_paused_loop_does_nothing_and_its_schedule_is_off():
    from django_celery_beat.models import PeriodicTask

    project = make_project()
    make_items(project, 2)
    control.loop_create(project=project, settings={"path": "dpo"}, every_seconds=30)

    control.loop_pause(project=project, paused=True)
    state = control.loop_tick_run(project_id=project.pk)

    assert [(s.name, s.status) for s in state.steps] == [("tick", "skipped")]
    assert Loop.objects.get(project=project).last_tick_status == "paused"
    assert not LoopEvent.objects.filter(loop__project=project).exists()
    assert PeriodicTask.objects.get(name=f"prefloop-loop-{project.pk}").enabled is False
    with pytest.raises(Conflict, match="paused"):
        control.loop_step_queue(project=project)

    control.loop_pause(project=project, paused=False)
    state = control.loop_tick_run(project_id=project.pk)
    assert [(s.name, s.status) for s in state.steps] == [("wait", "waiting")]
    assert PeriodicTask.objects.get(name=f"prefloop-loop-{project.pk}").enabled is True


# --------------------------------------------------------------------------- the command


def test_the_loop_command_saves_settings_shows_the_timeline_pauses_and_decides(capsys, tmp_path):
    project = make_project()
    researcher = make_user("loop-cmd-researcher")
    add_member(project, researcher, Membership.Role.RESEARCHER)
    round1 = Round.objects.create(project=project, number=1)
    make_items(project, 2, round_=round1)
    policy = ModelVersion.objects.create(
        name="cmd-policy", artifact_path=str(tmp_path), project=project
    )

    with pytest.raises(CommandError, match="path"):
        call_command("loop", "settings", project=project.pk, loop_settings='{"n_prompts": 4}')
    call_command("loop", "settings", project=project.pk, loop_settings='{"path": "dpo"}')
    assert Loop.objects.get(project=project).config["path"] == "dpo"

    call_command("loop", "step", project=project.pk)
    call_command("loop", "status", project=project.pk)
    out = capsys.readouterr().out
    assert "needs more labels" in out
    assert f"loop-{project.pk}-r1" in out
    assert "Round 1" in out

    call_command("loop", "pause", project=project.pk)
    assert Loop.objects.get(project=project).paused

    with pytest.raises(CommandError, match="reason"):
        call_command(
            "loop", "promote", project=project.pk, model_version=policy.pk, by=researcher.username
        )
    call_command(
        "loop",
        "promote",
        project=project.pk,
        model_version=policy.pk,
        by=researcher.username,
        reason="answers read better",
    )
    policy.refresh_from_db()
    assert policy.promotion == "promoted"
    assert policy.promoted_by == researcher
    assert policy.promotion_reason == "answers read better"


def test_the_timeline_shows_a_failed_evaluation_from_its_recorded_step(tmp_path):
    # Given an iteration whose policy was trained and whose evaluation step failed in a tick
    project = make_project()
    base = ModelVersion.objects.create(name="tl-base", artifact_path=str(tmp_path), project=project)
    round1 = Round.objects.create(project=project, number=1, model_version=base)
    key = loop.loop_key(round1)
    dataset = DatasetVersion.objects.create(
        project=project, version=1, name=key, status="ready", content_hash="c" * 64
    )
    run = TrainingRun.objects.create(
        recipe="dpo", project=project, dataset_version=dataset, status="succeeded"
    )
    policy = ModelVersion.objects.create(
        name="tl-policy", artifact_path=str(tmp_path / "gone"), training_run=run, parent=base
    )
    found = control.loop_create(project=project, settings={"path": "dpo"})
    state = loop.LoopState(key=key, loop_id=found.pk)
    state.add("dpo", "done", f"run {run.pk}")
    state.add("evaluate", "failed", f"no such folder {tmp_path}/gone")

    # When the timeline is read
    steps = {s.kind: s for s in loop_timeline(project=project).iterations[0].steps}

    # Then the evaluation step is failed, with the recorded error (no server path) and duration
    assert steps["evaluate"].status == "failed"
    assert "no such folder" in steps["evaluate"].error
    assert str(tmp_path) not in steps["evaluate"].error
    assert steps["evaluate"].duration_seconds is not None
    assert steps["evaluate"].model_version_id == policy.pk
    assert steps["gate"].status == "undecided"


def test_a_tick_while_another_tick_of_the_loop_runs_does_nothing():
    from django.db import connections

    project = make_project()
    make_items(project, 2)
    found = control.loop_create(project=project, settings={"path": "dpo"})
    # Another process holds the loop's tick lock (as a tick running in a worker does)
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [control.TICK_LOCK_SPACE, found.pk])
        state = control.loop_tick_run(project_id=project.pk)
        assert [(s.name, s.status) for s in state.steps] == [("tick", "skipped")]
        assert "another tick" in state.steps[0].detail
        assert not LoopEvent.objects.filter(loop=found).exists()
    finally:
        other.close()
    # Once it ends, ticks run again
    state = control.loop_tick_run(project_id=project.pk)
    assert [(s.name, s.status) for s in state.steps] == [("wait", "waiting")]


def test_an_iteration_exports_every_round_so_far_or_with_train_rounds_newest_only_its_own():
    from training.loop.settings import LoopSettings
    from training.loop.steps import _dataset

    project = make_project()
    annotator = make_user()
    rounds = [Round.objects.create(project=project, number=n) for n in (1, 2)]
    for round_ in rounds:
        for item in make_items(project, 6, round_=round_):
            Judgment.objects.create(project=project, item=item, annotator=annotator, choice="A")

    counts = {}
    for train_rounds in ("all", "newest"):
        settings = LoopSettings(path="dpo", train_rounds=train_rounds)
        version, status = _dataset(rounds[1], settings, f"loop-{train_rounds}")
        assert status == "started" and version.status == DatasetVersion.Status.READY
        assert sorted(version.source_rounds) == ([1, 2] if train_rounds == "all" else [2])
        counts[train_rounds] = sum(version.split_counts.values())
    assert counts == {"all": 12, "newest": 6}
