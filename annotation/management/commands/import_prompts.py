"""Import prompts (JSONL: text or chat messages, optional tags and id) into a project's pool."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from annotation.errors import ServiceError
from annotation.imports import ImportFailed, ImportTooLarge
from annotation.management.commands.import_items import open_input, print_errors
from annotation.models import Project
from annotation.prompt_pool import DEFAULT_EVAL_FRACTION, prompt_pool_import


class Command(BaseCommand):
    help = (
        "Add prompts to a project's prompt pool (JSONL, .gz allowed): deduplicated, with a "
        "fixed evaluation split chosen by a hash of each prompt; every bad line is listed and "
        "nothing is imported unless all are good."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", help='File of lines {"prompt": ...} or {"messages": [...]}.')
        parser.add_argument("--project", type=int, required=True, help="Project id.")
        parser.add_argument(
            "--eval-fraction",
            type=float,
            default=DEFAULT_EVAL_FRACTION,
            help="Share of new prompts kept for evaluation, never used by a training round.",
        )
        parser.add_argument("--no-progress", action="store_true", help="No progress bar.")

    def handle(self, *args, **options):
        project = Project.objects.filter(pk=options["project"]).first()
        if project is None:
            raise CommandError(f"--project: no project with id {options['project']}")
        bar = tqdm(unit=" prompts", disable=options["no_progress"], file=self.stderr)
        with open_input(options["path"]) as stream:
            try:
                report = prompt_pool_import(
                    project=project,
                    stream=stream,
                    eval_fraction=options["eval_fraction"],
                    progress=bar.update,
                )
            except ImportFailed as exc:
                bar.close()
                print_errors(self, exc)
            except ImportTooLarge as exc:
                raise CommandError(exc.message) from None
            except ServiceError as exc:
                raise CommandError(exc.message) from None
            finally:
                bar.close()
        for key, value in report.as_dict().items():
            self.stdout.write(f"{key}: {value}")
        self.stdout.write(
            self.style.SUCCESS(
                f"pool of {project}: {report.pool_train} train, {report.pool_eval} eval prompt(s)"
            )
        )
