"""Drive the real REST API with a pool of simulated annotators (careful, noisy, bad actors)
and, beside them, registered reward models labelling as AI annotators (source "ai")."""

import functools
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from annotation import services
from annotation.models import LabelSource, Membership, Project
from annotation.simulation import Profile, model_judge, parse_pool, run_pool

AI_PROFILE = Profile("model", noise=0.0, seconds_per_item=0.5)


class Command(BaseCommand):
    help = (
        "Label a project through the HTTP API with simulated annotators, e.g. "
        "`simulate --project 1 --pool careful:3,noisy:1,always_left:1,random:1 "
        "--url http://127.0.0.1:8000`. With `--ai-model-version ID` a registered reward model "
        "labels too, through the same API, as an AI annotator (its labels carry source 'ai')."
    )

    def add_arguments(self, parser):
        parser.add_argument("--project", type=int, required=True)
        parser.add_argument(
            "--url",
            default="http://127.0.0.1:8000",
            help="Base URL of a running Prefloop web server.",
        )
        parser.add_argument(
            "--pool",
            default="careful:3,noisy:1,always_left:1,random:1",
            help="kind:count,... with kinds careful, noisy, biased, always_left, random "
            "('' for none).",
        )
        parser.add_argument(
            "--ai-model-version",
            type=int,
            action="append",
            default=[],
            metavar="ID",
            help="A reward ModelVersion that labels as an AI annotator (repeatable).",
        )
        parser.add_argument(
            "--ai-tie-margin",
            type=float,
            default=0.0,
            help="Reward difference under which an AI annotator says 'tie' (if allowed).",
        )
        parser.add_argument(
            "--max-items",
            type=int,
            default=None,
            help="Stop each annotator after this many judgments.",
        )
        parser.add_argument(
            "--speedup",
            type=float,
            default=0.0,
            help="Sleep reported time / speedup per item (0: no sleep).",
        )
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, **options):
        project = Project.objects.filter(pk=options["project"]).first()
        if project is None:
            raise CommandError(f"No project {options['project']}.")
        try:
            pool = parse_pool(options["pool"]) if options["pool"].strip() else []
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        judges = self._ai_judges(options["ai_model_version"], options["ai_tie_margin"])
        if not pool and not judges:
            raise CommandError("Nothing to run: give --pool and/or --ai-model-version.")
        annotators = []
        for i, (kind, profile) in enumerate(pool):
            token = services.simulated_annotator_ensure(project=project, username=f"sim-{kind}-{i}")
            annotators.append((f"sim-{kind}-{i}", token, profile))
        for name in judges:
            token = services.simulated_annotator_ensure(
                project=project, username=name, source=LabelSource.AI
            )
            annotators.append((name, token, AI_PROFILE))
        self.stdout.write(
            f"{len(pool)} simulated and {len(judges)} AI annotators on {options['url']} ..."
        )
        stats = run_pool(
            base_url=options["url"],
            project_id=project.pk,
            annotators=annotators,
            max_items=options["max_items"],
            speedup=options["speedup"],
            seed=options["seed"],
            judges=judges,
        )
        for s in stats:
            paused = Membership.objects.filter(
                project=project, user__username=s.name, status=Membership.Status.PAUSED
            ).exists()
            self.stdout.write(
                f"{s.name:24s} {s.behaviour:12s} submitted={s.submitted:5d} "
                f"retries={s.retries:3d} {'PAUSED ' if paused else ''}"
                f"{'; '.join(s.errors[:2])}"
            )
        if any(e for s in stats for e in s.errors if not e.startswith("next: paused")):
            raise CommandError("Some simulated annotators hit errors (see above).")

    def _ai_judges(self, version_ids: list[int], tie_margin: float) -> dict:
        """Load each reward model once; return {annotator username: judge}."""
        from training.loop import reward_model_trained_on_chat
        from training.models import ModelVersion
        from training.scoring import reward_calibration

        judges = {}
        for version_id in version_ids:
            version = ModelVersion.objects.filter(pk=version_id).first()
            if version is None:
                raise CommandError(f"No model version {version_id}.")
            if version.kind != ModelVersion.Kind.REWARD:
                raise CommandError(
                    f"Model version {version_id} ({version.name}) is a {version.kind}, "
                    "not a reward model: it cannot score answers."
                )
            if not Path(version.artifact_path).is_dir():
                raise CommandError(
                    f"Model version {version_id}: no model folder at {version.artifact_path}."
                )
            judges[f"ai-rm-{version_id}"] = model_judge(
                functools.partial(
                    _scores,
                    path=version.artifact_path,
                    chat=reward_model_trained_on_chat(version),
                    calibration=reward_calibration(version.eval_results),
                ),
                tie_margin=tie_margin,
            )
        return judges


def _scores(prompt, answers: list[str], *, path: str, chat: bool, calibration) -> list[float]:
    """Score answers as the model was trained: a text prompt is one user turn for a model
    trained on conversations (the loop's exports are); the frozen calibration is applied."""
    from training.scoring import reward_scores

    if chat and isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    return reward_scores(path, prompt, answers, calibration=calibration)
