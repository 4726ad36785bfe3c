"""Score a reward model on an external preference file and print its metrics as JSON.

    manage.py evaluate_rm --model-version 7 --file hh-test.jsonl.gz --format hh --save
    manage.py evaluate_rm --path var/artifacts/run-3/final --file pairs.jsonl --limit 2000

The reading, scoring and metrics are ``training.rm_evaluation``'s. ``--save`` stores the
report in ``ModelVersion.eval_results["rm_metrics"]``, which the dashboard's reward-model
page plots.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from training import rm_evaluation
from training.models import ModelVersion
from training.rm_evaluation import FORMATS, RENDERS


class Command(BaseCommand):
    help = (
        "Score a reward model (--model-version ID or --path DIR) on a preference file "
        "(--format hh or trl, .gz allowed) and print accuracy, NLL, ROC-AUC, ECE, temperature, "
        "margins and length correlation as JSON; --save stores them on the model version."
    )

    def add_arguments(self, parser):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--model-version", type=int, help="Registered reward model id.")
        source.add_argument("--path", help="Reward model folder (transformers format).")
        parser.add_argument("--file", required=True, help="Preference JSONL (.gz allowed).")
        parser.add_argument("--format", choices=FORMATS, default="trl")
        parser.add_argument("--limit", type=int, default=None, help="Score a random N pairs.")
        parser.add_argument("--seed", type=int, default=0, help="Sampling, A/B order, split.")
        parser.add_argument(
            "--render",
            choices=RENDERS,
            default="auto",
            help="How dialogues become text: the model's own chat template when it has one "
            "(auto), always the chat template, or the plain HH dialogue.",
        )
        parser.add_argument("--batch-size", type=int, default=16)
        parser.add_argument(
            "--save", action="store_true", help='Store in eval_results["rm_metrics"].'
        )

    def handle(self, *args, **options):
        version = None
        if options["model_version"] is not None:
            version = ModelVersion.objects.filter(pk=options["model_version"]).first()
            if version is None:
                raise CommandError(f"no model version {options['model_version']}")
            if version.kind != ModelVersion.Kind.REWARD:
                raise CommandError(f"model version {version.pk} is a {version.kind} model")
            model_dir = version.artifact_path
        else:
            model_dir = options["path"]
            if options["save"]:
                raise CommandError("--save needs --model-version (a folder has no registry row)")
        if not Path(model_dir).is_dir():
            raise CommandError(f"model folder not found: {model_dir}")
        data = Path(options["file"])
        if not data.is_file():
            raise CommandError(f"no such file: {data}")
        if options["limit"] is not None and options["limit"] < 2:
            raise CommandError("--limit must be at least 2")

        started = time.perf_counter()
        pairs, summary = rm_evaluation.read_pairs(data, options["format"])
        if options["limit"] is not None and len(pairs) > options["limit"]:
            pairs = random.Random(options["seed"]).sample(pairs, options["limit"])
        if len(pairs) < 2:
            raise CommandError(
                f"{len(pairs)} usable pair(s) in {data} "
                f"(skipped: {summary['skipped_reasons'] or 'none'})"
            )
        metrics, rendering = rm_evaluation.reward_model_evaluate(
            model_dir=model_dir,
            pairs=pairs,
            fmt=options["format"],
            render=options["render"],
            batch_size=options["batch_size"],
            seed=options["seed"],
        )
        report = {
            "model": {
                "id": version.pk if version else None,
                "name": version.name if version else None,
                "path": str(model_dir),
            },
            "data": {
                "file": str(data),
                "format": options["format"],
                "limit": options["limit"],
                "seed": options["seed"],
                "rendering": rendering,
                **summary,
            },
            **metrics,
            "evaluated_at": timezone.now().isoformat(),
            "seconds": round(time.perf_counter() - started, 2),
        }
        if options["save"]:
            rm_evaluation.reward_model_evaluation_save(version=version, report=report)
        self.stdout.write(json.dumps(report, indent=2))
