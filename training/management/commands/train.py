"""Create a training run and queue it, or run it here with --sync."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from annotation.errors import ServiceError
from annotation.models import DatasetVersion, Project
from training import services
from training.management.commands._progress import run_sync
from training.models import ModelVersion, Recipe


def load_config(value: str) -> dict:
    """Read a config given as a JSON/YAML file path or as inline JSON."""
    path = Path(value)
    if path.is_file():
        text = path.read_text()
        if path.suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    else:
        try:
            data = json.loads(value)
        except ValueError as exc:
            raise CommandError(f"--config: no such file and not JSON: {value}") from exc
    if not isinstance(data, dict):
        raise CommandError("--config must hold a JSON object")
    return data


def model_version_lookup(value: str) -> ModelVersion:
    version = (
        ModelVersion.objects.filter(pk=int(value)).first()
        if value.isdigit()
        else ModelVersion.objects.filter(name=value).first()
    )
    if version is None:
        raise CommandError(f"No model version {value!r}")
    return version


class Command(BaseCommand):
    help = "Train a recipe on a dataset version or snapshot folder (queued, or --sync here)."

    def add_arguments(self, parser):
        parser.add_argument("recipe", choices=Recipe.values)
        parser.add_argument(
            "--config", default="{}", help="JSON/YAML file, or inline JSON, of config fields"
        )
        data = parser.add_mutually_exclusive_group(required=True)
        data.add_argument("--dataset-version", type=int, help="DatasetVersion id")
        data.add_argument("--data", help="snapshot folder (train.jsonl, ...)")
        parser.add_argument("--base-model", help="ModelVersion id or name to start from")
        parser.add_argument("--base-model-path", default="", help="local model folder")
        parser.add_argument("--project", type=int, help="Project id")
        parser.add_argument(
            "--sync", action="store_true", help="train in this process, without a worker"
        )

    def handle(self, *args, **options):
        dataset_version = None
        if options["dataset_version"] is not None:
            dataset_version = DatasetVersion.objects.filter(pk=options["dataset_version"]).first()
            if dataset_version is None:
                raise CommandError(f"No dataset version {options['dataset_version']}")
        project = None
        if options["project"] is not None:
            project = Project.objects.filter(pk=options["project"]).first()
            if project is None:
                raise CommandError(f"No project {options['project']}")
        base_model = model_version_lookup(options["base_model"]) if options["base_model"] else None
        try:
            run = services.training_run_create(
                recipe=options["recipe"],
                config=load_config(options["config"]),
                dataset_version=dataset_version,
                dataset_path=options["data"],
                base_model=base_model,
                base_model_path=options["base_model_path"],
                project=project,
                enqueue=not options["sync"],
            )
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"run {run.pk} created; artefacts in {run.output_dir}")
        if not options["sync"]:
            self.stdout.write(f"queued on the gpu queue; follow it at /api/training/runs/{run.pk}/")
            return
        run_sync(self, run.pk)
