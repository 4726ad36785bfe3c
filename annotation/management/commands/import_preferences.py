"""Import existing preference data (HH-RLHF, TRL, K-way rankings) as imported judgments."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from annotation.errors import ServiceError
from annotation.imports import FORMATS, ImportFailed, ImportTooLarge, preferences_import
from annotation.management.commands.import_items import open_input, print_errors, project_from_arg
from annotation.models import Round


class Command(BaseCommand):
    help = (
        "Import preference data: --format hh ({chosen, rejected} dialogues), trl "
        "({prompt, chosen, rejected}, plain or conversational) or ranking "
        "({prompt, candidates, ranking}). Validated whole, then written atomically."
    )

    def add_arguments(self, parser):
        parser.add_argument("project", help="Project id or name.")
        parser.add_argument("path", help="JSONL file (optionally .gz).")
        parser.add_argument("--format", choices=FORMATS, required=True)
        parser.add_argument("--batch", default="", help="Batch name (default: file hash).")
        parser.add_argument("--round", type=int, default=None, help="Existing round number.")
        parser.add_argument(
            "--serve", action="store_true", help="Leave the new round open for annotators."
        )
        parser.add_argument(
            "--near-duplicates", action="store_true", help="Report near-duplicate prompts."
        )
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args, **options):
        project = project_from_arg(options["project"])
        round_ = None
        if options["round"] is not None:
            round_ = Round.objects.filter(project=project, number=options["round"]).first()
            if round_ is None:
                raise CommandError(f"no round {options['round']} in {project}")
        bar = tqdm(unit=" lines", disable=options["no_progress"], file=self.stderr)
        with open_input(options["path"]) as stream:
            try:
                report = preferences_import(
                    project=project,
                    stream=stream,
                    fmt=options["format"],
                    batch=options["batch"],
                    round_=round_,
                    serve=options["serve"],
                    near_duplicates=options["near_duplicates"],
                    progress=bar.update,
                )
            except ImportTooLarge as exc:
                bar.close()
                raise CommandError(exc.message) from None
            except ImportFailed as exc:
                bar.close()
                print_errors(self, exc)
            except ServiceError as exc:
                bar.close()
                raise CommandError(exc.message) from exc
        bar.close()
        self.stdout.write(json.dumps(report.as_dict(), indent=2, ensure_ascii=False))
        self.stdout.write(
            self.style.SUCCESS(
                f"batch {report.batch}: {report.judgments_created} judgment(s) on "
                f"{report.items_created} new item(s) in round {report.round_number}"
            )
        )
