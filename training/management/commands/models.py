"""List the model registry with lineage."""

import json

from django.core.management.base import BaseCommand

from training.models import ModelVersion
from training.selectors import model_version_lineage

SHOWN_METRICS = ("eval_accuracy", "test_accuracy", "eval_loss", "eval_rewards/accuracies")


class Command(BaseCommand):
    help = "List model versions: kind, artefact, parent chain, training run and dataset."

    def add_arguments(self, parser):
        parser.add_argument("--kind", choices=ModelVersion.Kind.values)
        parser.add_argument("--json", action="store_true", help="one JSON object per line")

    def handle(self, *args, **options):
        versions = ModelVersion.objects.select_related(
            "parent", "training_run", "dataset_version"
        ).order_by("created_at", "pk")
        if options["kind"]:
            versions = versions.filter(kind=options["kind"])
        for version in versions:
            chain = model_version_lineage(version=version)
            lineage = [item.name for item in chain]
            if chain[-1].base_model_path:
                lineage.append(chain[-1].base_model_path)
            dataset = version.dataset_version
            record = {
                "id": version.pk,
                "name": version.name,
                "kind": version.kind,
                "artifact_path": version.artifact_path,
                "lineage": lineage,
                "training_run": version.training_run_id,
                "dataset_version": dataset.pk if dataset else None,
                "dataset": str(dataset)
                if dataset
                else (version.training_run.dataset_path if version.training_run else ""),
                "eval_results": version.eval_results,
            }
            if options["json"]:
                self.stdout.write(json.dumps(record, default=str))
                continue
            metrics = ", ".join(
                f"{key}={version.eval_results[key]:.4g}"
                for key in SHOWN_METRICS
                if isinstance(version.eval_results.get(key), int | float)
            )
            self.stdout.write(
                f"#{version.pk} {version.name} [{version.kind}] run={version.training_run_id} "
                f"data={record['dataset'] or '-'}\n"
                f"    lineage: {' <- '.join(lineage)}\n"
                f"    artefact: {version.artifact_path}" + (f"\n    {metrics}" if metrics else "")
            )
        if not versions:
            self.stdout.write("no model versions")
