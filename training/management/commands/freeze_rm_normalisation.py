"""Freeze a reward model's normalisation: mean and std of its reward on a reference policy.

    manage.py freeze_rm_normalisation --model-version 7 --policy-version 3

The reward of the reference policy's stored answers (``Candidate`` rows of that policy) is
measured once at the model's stored temperature and written into
``ModelVersion.eval_results["calibration"]["normalisation"]``; the scorer then returns
(r / T - mean) / std, so 0 is the reference policy's average answer and 1 one standard
deviation better. The service is ``training.rm_evaluation.reward_model_normalisation_freeze``.
"""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from annotation.errors import ServiceError
from training import rm_evaluation
from training.models import ModelVersion


class Command(BaseCommand):
    help = (
        "Measure a reward model's mean and std on a reference policy's answers and freeze "
        "them into the model version's calibration (once)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--model-version", type=int, required=True, help="Reward model id.")
        parser.add_argument(
            "--policy-version", type=int, required=True, help="Reference policy's model id."
        )
        parser.add_argument("--limit", type=int, default=2000, help="Answers to score at most.")

    def handle(self, *args, **options):
        version = ModelVersion.objects.filter(pk=options["model_version"]).first()
        if version is None or version.kind != ModelVersion.Kind.REWARD:
            raise CommandError(f"no reward model version {options['model_version']}")
        policy = ModelVersion.objects.filter(pk=options["policy_version"]).first()
        if policy is None or policy.kind != ModelVersion.Kind.POLICY:
            raise CommandError(f"no policy model version {options['policy_version']}")
        if options["limit"] < 2:
            raise CommandError("--limit must be at least 2")
        try:
            normalisation = rm_evaluation.reward_model_normalisation_freeze(
                version=version, policy_version=policy, limit=options["limit"]
            )
        except ServiceError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(json.dumps(normalisation, indent=2))
