"""The model registry from the shell: list versions, register a folder, validate.

    manage.py models [--kind K] [--json]                 # list (also: models list)
    manage.py models register --kind policy --name N --path FOLDER [--project ID]
                              [--prompt-format plain] [--queue]
    manage.py models validate ID [--queue]

The command is the server itself: it may register any folder under the deployment's roots
(ARTIFACT_ROOT, PREFLOOP_MODEL_ROOTS). Validation runs here, printing one line per stage,
unless --queue sends it to a Celery worker.
"""

import argparse
import json

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from annotation.errors import ServiceError
from annotation.models import Project
from training import registry
from training.models import ModelVersion
from training.selectors import model_version_lineage

SHOWN_METRICS = ("eval_accuracy", "test_accuracy", "eval_loss", "eval_rewards/accuracies")


class Command(BaseCommand):
    help = "List model versions (kind, status, lineage); register a folder; validate a version."

    def add_arguments(self, parser):
        self._list_arguments(parser, default=None)
        actions = parser.add_subparsers(dest="action", required=False)
        self._list_arguments(
            actions.add_parser("list", help="list model versions (the default)"),
            default=argparse.SUPPRESS,
        )
        register = actions.add_parser("register", help="register a policy or reward model folder")
        register.add_argument("--kind", required=True, choices=registry.WEIGHT_KINDS)
        register.add_argument("--name", required=True, help="unique name of the version")
        register.add_argument("--path", required=True, help="folder under the model roots")
        register.add_argument("--project", type=int, help="id of the project it is for")
        register.add_argument(
            "--prompt-format",
            default=registry.DEFAULT_PROMPT_FORMAT,
            choices=list(registry.PROMPT_FORMATS),
            help="plain: the tokenizer has no chat template; prompts are Human:/Assistant: text",
        )
        register.add_argument(
            "--queue", action="store_true", help="validate on a Celery worker, not here"
        )
        validate = actions.add_parser("validate", help="validate a registered version again")
        validate.add_argument("version", help="id or name of the version")
        validate.add_argument(
            "--queue", action="store_true", help="validate on a Celery worker, not here"
        )

    @staticmethod
    def _list_arguments(parser, *, default):
        parser.add_argument("--kind", choices=ModelVersion.Kind.values, default=default)
        parser.add_argument(
            "--json", action="store_true", help="one JSON object per line", default=default
        )

    def handle(self, *args, **options):
        action = options.get("action") or "list"
        if action == "register":
            return self._register(options)
        if action == "validate":
            return self._validate(options)
        return self._list(options)

    # ---------------------------------------------------------------- register, validate

    def _register(self, options):
        project = None
        if options["project"] is not None:
            project = Project.objects.filter(pk=options["project"]).first()
            if project is None:
                raise CommandError(f"--project: no project {options['project']}.")
        try:
            with transaction.atomic():
                version = registry.model_version_register_folder(
                    name=options["name"],
                    kind=options["kind"],
                    path=options["path"],
                    project=project,
                    prompt_format=options["prompt_format"],
                    enqueue=options["queue"],
                )
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"registered #{version.pk} {version.name} ({version.kind}): pending")
        return self._finish(version, queue=options["queue"])

    def _validate(self, options):
        value = options["version"]
        version = (
            ModelVersion.objects.filter(pk=int(value)).first()
            if value.isdigit()
            else ModelVersion.objects.filter(name=value).first()
        )
        if version is None:
            raise CommandError(f"No model version {value!r}.")
        try:
            with transaction.atomic():
                version = registry.model_version_revalidate(
                    version=version, enqueue=options["queue"]
                )
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
        return self._finish(version, queue=options["queue"])

    def _finish(self, version: ModelVersion, *, queue: bool) -> None:
        if queue:
            self.stdout.write(
                f"validation queued; see `manage.py models --json` or "
                f"GET /api/training/models/{version.pk}/"
            )
            return
        version = registry.model_version_validate(
            version_id=version.pk, progress=lambda line: self.stderr.write(f"  {line}")
        )
        self.stdout.write(self._status_line(version))
        if version.status != ModelVersion.Status.READY:
            raise CommandError(f"Model version {version.pk} failed validation.")

    @staticmethod
    def _status_line(version: ModelVersion) -> str:
        if version.status == ModelVersion.Status.FAILED:
            return f"#{version.pk} {version.name}: failed: {version.validation_error}"
        record = version.validation or {}
        hashes = record.get("hashes") or {}
        return (
            f"#{version.pk} {version.name}: {version.status}; {record.get('architecture')}, "
            f"{record.get('parameters')} parameters, {record.get('dtype')}, prompt format "
            f"{record.get('prompt_format')}; weights sha256 {(hashes.get('weights') or '')[:12]}"
        )

    # ---------------------------------------------------------------- list

    def _list(self, options):
        versions = ModelVersion.objects.select_related(
            "parent", "training_run", "dataset_version"
        ).order_by("created_at", "pk")
        if options.get("kind"):
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
                "status": version.status,
                "promotion": version.promotion,
                "source": version.source,
                "artifact_path": version.artifact_path,
                "lineage": lineage,
                "training_run": version.training_run_id,
                "dataset_version": dataset.pk if dataset else None,
                "dataset": str(dataset)
                if dataset
                else (version.training_run.dataset_path if version.training_run else ""),
                "eval_results": version.eval_results,
                "validation": version.validation,
                "validation_error": version.validation_error,
            }
            if options.get("json"):
                self.stdout.write(json.dumps(record, default=str))
                continue
            metrics = ", ".join(
                f"{key}={version.eval_results[key]:.4g}"
                for key in SHOWN_METRICS
                if isinstance(version.eval_results.get(key), int | float)
            )
            self.stdout.write(
                f"#{version.pk} {version.name} [{version.kind}, {version.status}, "
                f"{version.source}] run={version.training_run_id} "
                f"data={record['dataset'] or '-'}\n"
                f"    lineage: {' <- '.join(lineage)}\n"
                f"    artefact: {version.artifact_path}"
                + (f"\n    {metrics}" if metrics else "")
                + (f"\n    error: {version.validation_error}" if version.validation_error else "")
            )
        if not versions:
            self.stdout.write("no model versions")
