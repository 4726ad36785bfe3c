"""The steps of one loop iteration: export, train, evaluate, generate the next round.

An iteration is keyed by the round it learns from (`loop-<project>-r<number>`), and each of
its steps leaves a row that the next call finds instead of redoing the work:

    export    DatasetVersion named by the key
    train     TrainingRun(s) on that dataset version (DPO, or reward model then PPO)
    evaluate  eval_results on the new policy's ModelVersion
    generate  the next Round, created with source_key "<key>:gen"

`loop_advance` moves an iteration as far as it can and returns what it did. Run with
`sync=True` it trains and generates in-process; otherwise it queues the slow steps on the
`gpu` queue and returns, and the next tick (django-celery-beat) picks up from there, so a
failed step can be retried alone and a researcher can pause the schedule.
"""

from __future__ import annotations

import logging
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from django.db import transaction

from annotation import services as annotation_services
from annotation.models import Judgment, Project, Round
from training import config_policy
from training.loop.evaluate_steps import (
    evaluate_step,
    gate_step,
    human_round_step,
    human_verdicts_step,
    num,
)
from training.loop.settings import DPO_DEFAULTS, PPO_DEFAULTS, REWARD_DEFAULTS, LoopSettings
from training.models import ModelVersion, TrainingRun
from training.rounds import generate_round_now

logger = logging.getLogger(__name__)


# The Loop row whose events this context records; `training.loop.control` sets it while a
# tick runs, so every way of ticking (beat, API, console, command) records the same way.
RECORDING_LOOP: ContextVar[int | None] = ContextVar("prefloop_recording_loop", default=None)
_KEY = re.compile(r"^loop-(\d+)-r(\d+)$")
_POLICY_RECIPES = ("dpo", "ppo")


@dataclass
class Step:
    name: str
    status: str  # done | started | waiting | failed | skipped
    detail: str = ""
    duration_seconds: float | None = None


@dataclass
class LoopState:
    key: str
    steps: list[Step] = field(default_factory=list)
    new_round: Round | None = None
    loop_id: int | None = field(default_factory=RECORDING_LOOP.get)
    _mark: float = field(default_factory=time.monotonic, repr=False)

    def add(
        self,
        name: str,
        status: str,
        detail: str = "",
        *,
        round_: Round | None = None,
        run: TrainingRun | None = None,
        model_version: ModelVersion | None = None,
    ) -> None:
        """Record a step: its duration since the previous one, and a LoopEvent when recording."""
        now = time.monotonic()
        step = Step(name, status, detail, round(now - self._mark, 3))
        self._mark = now
        self.steps.append(step)
        logger.info("loop %s: %s %s %s", self.key, name, status, detail)
        if self.loop_id is not None:
            _event_record(self, step, round_=round_, run=run, model_version=model_version)


def _event_record(
    state: LoopState,
    step: Step,
    *,
    round_: Round | None,
    run: TrainingRun | None,
    model_version: ModelVersion | None,
) -> None:
    """Write the step as a LoopEvent, linked to the rows of its iteration it is about."""
    from datetime import timedelta

    from django.utils import timezone

    from training.models import LoopEvent

    match = _KEY.match(state.key)
    if match is not None:
        project_id, number = int(match.group(1)), int(match.group(2))
        if round_ is None and step.name == "generate":
            round_ = Round.objects.filter(
                project_id=project_id, source_key=f"{state.key}:gen"
            ).first()
        if round_ is None:
            round_ = Round.objects.filter(project_id=project_id, number=number).first()
        runs = TrainingRun.objects.filter(
            project_id=project_id, dataset_version__name=state.key
        ).order_by("-id")
        if run is None and step.name in ("dpo", "reward", "ppo"):
            run = runs.filter(recipe=step.name).first()
        if model_version is None and step.name in ("evaluate", "gate", "generate"):
            model_version = (
                ModelVersion.objects.filter(
                    training_run__in=runs.filter(recipe__in=_POLICY_RECIPES)
                )
                .order_by("-id")
                .first()
            )
        if model_version is None and step.name.startswith("rm_"):
            model_version = (
                ModelVersion.objects.filter(training_run__in=runs.filter(recipe="reward"))
                .order_by("-id")
                .first()
            )
    if model_version is None and run is not None:
        model_version = ModelVersion.objects.filter(training_run=run).first()
    finished = timezone.now()
    event = LoopEvent.objects.create(
        loop_id=state.loop_id,
        key=state.key,
        step=step.name,
        status=step.status,
        detail=config_policy.paths_redact(step.detail),  # researchers read it
        round=round_,
        training_run=run,
        model_version=model_version,
        finished_at=finished,
        duration_seconds=step.duration_seconds,
    )
    # started_at is set on insert; the step began `duration` before it was recorded.
    LoopEvent.objects.filter(pk=event.pk).update(
        started_at=finished - timedelta(seconds=step.duration_seconds or 0.0)
    )


def loop_key(round_: Round) -> str:
    return f"loop-{round_.project_id}-r{round_.number}"


# --------------------------------------------------------------------------- iteration


def _labels_in(round_: Round, sources: list[str]) -> int:
    return Judgment.objects.filter(item__round=round_).primary().of_sources(sources).count()


def loop_ready(*, project: Project, settings: LoopSettings) -> Round | None:
    """Return the open round an iteration can learn from now, or None."""
    round_ = _training_rounds(project).first()
    if round_ is None:
        return None
    labels = _labels_in(round_, settings.sources)
    if settings.min_new_judgments:
        return round_ if labels >= settings.min_new_judgments else None
    needed = round_.items.filter(is_gold=False).count() * project.overlap
    return round_ if needed and labels >= needed else None


def _dataset(round_: Round, settings: LoopSettings, key: str):
    from annotation.models import DatasetVersion

    versions = DatasetVersion.objects.filter(project=round_.project, name=key)
    existing = versions.exclude(status="failed").order_by("-version").first()
    if existing is not None and existing.status == "ready":
        return existing, "done"
    failed = versions.filter(status="failed").order_by("-version").first()
    if existing is None and failed is not None:
        newer = Judgment.objects.filter(item__round=round_, created_at__gt=failed.created_at)
        if not newer.exists():
            # Rebuilding the same labels would fail the same way: wait for new labels.
            return failed, "failed"
    from annotation.exports import dataset_version_build, dataset_version_create

    if existing is None:
        rounds = (
            [round_.number]
            if settings.train_rounds == "newest"
            else list(
                Round.objects.filter(project=round_.project, number__lte=round_.number).values_list(
                    "number", flat=True
                )
            )
        )
        existing = dataset_version_create(
            project=round_.project,
            name=key,
            policy={
                "format": "trl",
                # Candidates were sampled through the chat template (generate_candidates), so
                # train on chat rows too: plain-text rows skip the template in DPO/RM/PPO.
                "conversational": True,
                "aggregation": settings.aggregation,
                "sources": settings.sources,
                "ties": "drop",
                "both_bad": "drop",
                "rounds": rounds,
                # A held-out human test split: the reward model trained here is scored on it.
                "split": {"train": 0.8, "validation": 0.1, "test": 0.1},
                "seed": settings.seed,
                "hf": False,
            },
        )
    from annotation.errors import ServiceError

    try:
        version = dataset_version_build(dataset_version_id=existing.pk)
    except ServiceError:
        existing.refresh_from_db()
        return existing, "failed"
    return version, "started"


def _runs_of(project, dataset_version, recipe: str, train_on: str):
    """Return the iteration's runs of `recipe` (newest first); for the reward recipe, those
    learning from `train_on` ('train': the policy's reward model, 'held_out': its judge)."""
    runs = TrainingRun.objects.filter(
        project=project, dataset_version=dataset_version, recipe=recipe
    ).order_by("-id")
    return [r for r in runs if (r.config or {}).get("train_on", "train") == train_on]


def _run_for(project, dataset_version, recipe: str, train_on: str = "train") -> TrainingRun | None:
    skip = (TrainingRun.Status.FAILED, TrainingRun.Status.CANCELLED)
    runs = _runs_of(project, dataset_version, recipe, train_on)
    return next((r for r in runs if r.status not in skip), None)


def _train(
    *,
    recipe: str,
    config: dict,
    project,
    dataset_version,
    base_model,
    sync: bool,
    state,
) -> TrainingRun | None:
    """Return the iteration's finished run of `recipe`, creating or running it if needed."""
    from training import services as training_services
    from training import supervisor as training_supervisor

    train_on = config.get("train_on", "train")
    step = "judge" if train_on == "held_out" else recipe
    run = _run_for(project, dataset_version, recipe, train_on)
    if run is None:
        runs = _runs_of(project, dataset_version, recipe, train_on)
        failed = next((r for r in runs if r.status == TrainingRun.Status.FAILED), None)
        if failed is not None and not sync:
            state.add(step, "failed", f"run {failed.pk}: {failed.error[-300:]}")
            return None
        run = training_services.training_run_create(
            recipe=recipe,
            config=config,
            dataset_version=dataset_version,
            base_model=base_model,
            project=project,
            enqueue=not sync,
        )
    if run.status == TrainingRun.Status.SUCCEEDED:
        state.add(step, "done", f"run {run.pk}")
        return run
    if sync:
        run = training_supervisor.training_run_execute(run_id=run.pk)
        if run is None or run.status != TrainingRun.Status.SUCCEEDED:
            error = run.error[-500:] if run else "run vanished"
            state.add(step, "failed", f"run {run.pk if run else '?'}: {error}")
            return None
        state.add(step, "done", f"run {run.pk}")
        return run
    state.add(step, "waiting", f"run {run.pk} is {run.status}")
    return None


def loop_advance(
    *, project: Project, settings: LoopSettings, sync: bool = False, force: bool = False
) -> LoopState:
    """Move the project's current iteration as far as it can go; return the steps taken."""
    round_ = _training_rounds(project).first()
    if round_ is None:
        return LoopState(key="-", steps=[Step("start", "skipped", "no round yet")])
    key = loop_key(round_)
    state = LoopState(key=key)
    human_verdicts_step(project, state)
    if round_.source_key.endswith(":gen") and not round_.items.exists():
        # A previous iteration opened this round but its generation did not finish.
        previous = _training_rounds(project).filter(number__lt=round_.number).first()
        if previous is not None:
            return _generate_step(project, previous, round_.model_version, settings, state, sync)
    if not force and loop_ready(project=project, settings=settings) is None:
        state.add("wait", "waiting", f"round {round_.number} needs more labels")
        return state
    from training.loop.gate import policy_current

    # A round imported without a policy learns into the project's current policy (its last
    # promoted one), so a project whose rounds came from elsewhere can start the loop.
    parent = round_.model_version or policy_current(project=project)
    if parent is None or parent.kind == ModelVersion.Kind.ENDPOINT:
        why = (
            f"round {round_.number} has no policy version"
            if parent is None
            else f"{parent.name} is a policy behind an endpoint, with no weights here to train"
        )
        step = ("start", "skipped") if parent is None else ("train", "failed")
        state.add(*step, f"{why}: register the policy to train and promote it")
        return state

    dataset, status = _dataset(round_, settings, key)
    if status == "failed":
        state.add("export", "failed", f"dataset v{dataset.version}: {dataset.error[-300:]}")
        return state
    state.add("export", status, f"dataset v{dataset.version} {dataset.split_counts}")
    if dataset.status != "ready":
        state.add("export", "waiting", dataset.status)
        return state

    run = _train_policy(project, parent, dataset, settings, state, sync)
    if run is None:
        return state
    policy = ModelVersion.objects.get(training_run=run)
    evaluation_error = evaluate_step(project, policy, settings, state, sync)
    policy.refresh_from_db(fields=["promotion"])
    if evaluation_error is None and not policy.promotion:
        return state  # a gpu worker evaluates it; a later tick goes on from here
    if evaluation_error and not policy.promotion:
        # Nothing says whether the policy is better: wait for the evaluation to succeed on a
        # later tick, or for a researcher to promote or reject it by hand.
        state.add(
            "gate",
            "waiting",
            f"policy {policy.pk} is not evaluated; fix the evaluation or promote or reject "
            "it by hand",
        )
        return state
    gate_step(policy, settings, state)
    if settings.evaluation["human_round"] and not evaluation_error:
        human_round_step(project, policy, settings, state, sync)
    annotation_services.round_close(round_=round_)
    # The next round comes from the last promoted policy (this one if the gate passed it).
    from training.loop.gate import policy_current

    source = policy_current(project=project) or policy
    return _generate_step(project, round_, source, settings, state, sync)


def _train_policy(
    project, parent, dataset, settings: LoopSettings, state, sync
) -> TrainingRun | None:
    """Return the iteration's finished policy run (DPO, or reward model then PPO), or None."""
    if settings.path == "dpo":
        config = {**DPO_DEFAULTS, **settings.dpo, "seed": settings.seed}
        run = _train(
            recipe="dpo",
            config=config,
            project=project,
            dataset_version=dataset,
            base_model=parent,
            sync=sync,
            state=state,
        )
    else:
        rm_config = {
            **REWARD_DEFAULTS,
            **settings.reward,
            "seed": settings.seed,
            "model_name_or_path": settings.reward.get("model_name_or_path") or parent.artifact_path,
        }

        def train_reward(config: dict) -> TrainingRun | None:
            return _train(
                recipe="reward",
                config=config,
                project=project,
                dataset_version=dataset,
                base_model=None,
                sync=sync,
                state=state,
            )

        judge = None
        if settings.held_out_judge:
            # Trained first, so the policy's reward model stays the project's newest.
            judge_run = train_reward({**rm_config, "train_on": "held_out", "ensemble_size": 1})
            if judge_run is None:
                return None
            judge = judge_run.model_version
        rm_run = train_reward(rm_config)
        if rm_run is None:
            return None
        reward_model = rm_run.model_version
        _reward_model_check_step(reward_model, dataset, parent, settings, state)
        from training.loop.gate import kl_budget
        from training.scoring import reward_calibration

        reward_model.refresh_from_db(fields=["eval_results"])
        ppo_config = {
            **PPO_DEFAULTS,
            **settings.ppo,
            "seed": settings.seed,
            "reward_model_path": reward_model.artifact_path,
            # The gate's budget is the one KL budget: PPO stops before it is spent.
            "kl_budget": kl_budget(settings=settings),
        }
        if judge is not None and "judge_reward_model_path" not in settings.ppo:
            ppo_config["judge_reward_model_path"] = judge.artifact_path
        calibration = reward_calibration(reward_model.eval_results)
        # An explicit ppo.reward_calibration (e.g. {} for raw scores) overrides the frozen one.
        if calibration is not None and "reward_calibration" not in settings.ppo:
            # PPO reads the frozen temperature and normalisation instead of normalising on
            # the fly, and records which reward model version they came from.
            ppo_config["normalize_score"] = False
            ppo_config["reward_calibration"] = {
                "temperature": calibration.temperature,
                "mean": calibration.shift,
                "std": calibration.scale,
                "model_version_id": reward_model.pk,
            }
        run = _train(
            recipe="ppo",
            config=ppo_config,
            project=project,
            dataset_version=dataset,
            base_model=parent,
            sync=sync,
            state=state,
        )
    return run


def _reward_model_check_step(reward_model, dataset, parent, settings, state) -> None:
    """Score the new reward model on the export's held-out test split; freeze its normalisation.

    The normalisation (mean 0, std 1 on the reference policy's answers) is what PPO reads.
    """
    from annotation.errors import Conflict
    from training.rm_evaluation import (
        reward_model_normalisation_freeze,
        reward_model_test_split_evaluate,
    )

    report = reward_model.eval_results.get("rm_metrics") or {}
    if report.get("split") != "test":
        try:
            report = (
                reward_model_test_split_evaluate(
                    version=reward_model, dataset_version=dataset, seed=settings.seed
                )
                or {}
            )
        except (ValueError, RuntimeError) as exc:
            state.add("rm_test", "failed", f"reward model {reward_model.pk}: {exc}"[:300])
            report = {}
    if report.get("split") == "test":
        state.add(
            "rm_test",
            "done",
            f"reward model {reward_model.pk} on {report['n_pairs']} held-out test pairs: "
            f"accuracy {report['accuracy']:.3f}, NLL {report['nll']:.3f}, "
            f"AUC {num(report.get('roc_auc'))}, ECE {num(report.get('ece'))}",
        )
    elif not report:
        state.add("rm_test", "skipped", f"dataset v{dataset.version} has no test pairs")
    calibration = reward_model.eval_results.get("calibration") or {}
    if calibration.get("normalisation"):
        return
    try:
        frozen = reward_model_normalisation_freeze(version=reward_model, policy_version=parent)
    except Conflict as exc:
        state.add("rm_normalise", "skipped", exc.message[:300])
        return
    state.add(
        "rm_normalise",
        "done",
        f"mean {frozen['mean']:.3f} std {frozen['std']:.3f} on {frozen['n_answers']} answers",
    )


def _training_rounds(project: Project):
    """Return the project's rounds the loop learns from, newest first (no evaluation rounds)."""
    return (
        Round.objects.filter(project=project)
        .exclude(purpose=Round.Purpose.EVAL)
        .order_by("-number")
    )


def _generate_step(project, learned_from: Round, policy, settings, state, sync) -> LoopState:
    key = f"{loop_key(learned_from)}:gen"
    if not sync:
        existing = Round.objects.filter(project=project, source_key=key).first()
        if existing is not None and existing.items.exists():
            state.new_round = existing
            state.add("generate", "done", f"round {existing.number}")
            return state
        from training.loop_tasks import generate_round

        annotation_services.round_create(project=project, model_version=policy, source_key=key)
        transaction.on_commit(
            lambda: generate_round.delay(project.pk, policy.pk, key, settings.to_dict())
        )
        state.add("generate", "started", key)
        return state
    round_ = generate_round_now(
        project_id=project.pk,
        model_version_id=policy.pk,
        source_key=key,
        settings=settings.to_dict(),
    )
    state.new_round = round_
    state.add("generate", "done", f"round {round_.number}: {round_.items.count()} items")
    return state
