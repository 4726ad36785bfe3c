"""Import prompts with K candidates (JSONL or CSV, optionally gzipped) into a project round."""

from __future__ import annotations

import gzip
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from annotation.imports import ImportFailed, ImportTooLarge, items_import
from annotation.models import Project, Round


def project_from_arg(value: str) -> Project:
    """Return the project with this id or name."""
    project = Project.objects.filter(pk=int(value)).first() if value.isdigit() else None
    project = project or Project.objects.filter(name=value).first()
    if project is None:
        raise CommandError(f"no project with id or name {value!r}")
    return project


def open_input(path: str):
    """Open a file for binary reading, through gzip when its name ends in .gz."""
    file = Path(path)
    if not file.exists():
        raise CommandError(f"no such file: {path}")
    return gzip.open(file, "rb") if file.suffix == ".gz" else file.open("rb")


def print_errors(command: BaseCommand, exc: ImportFailed) -> None:
    """Write every reported bad line to stderr and fail the command."""
    for line, message in exc.errors:
        command.stderr.write(f"line {line}: {message}")
    raise CommandError(f"{exc.total_bad} bad line(s); nothing was imported")


class Command(BaseCommand):
    help = "Import prompts + K candidates (JSONL or CSV; .gz allowed): validated, then atomic."

    def add_arguments(self, parser):
        parser.add_argument("project", help="Project id or name.")
        parser.add_argument("path", help="File to import (.jsonl, .csv, optionally .gz).")
        parser.add_argument("--format", choices=["jsonl", "csv"], default=None)
        parser.add_argument("--round", type=int, default=None, help="Existing round number.")

    def handle(self, *args, **options):
        project = project_from_arg(options["project"])
        path = options["path"]
        fmt = options["format"] or ("csv" if ".csv" in Path(path).name else "jsonl")
        round_ = None
        if options["round"] is not None:
            round_ = Round.objects.filter(project=project, number=options["round"]).first()
            if round_ is None:
                raise CommandError(f"no round {options['round']} in {project}")
        with open_input(path) as stream:
            try:
                report = items_import(project=project, stream=stream, fmt=fmt, round_=round_)
            except ImportFailed as exc:
                print_errors(self, exc)
            except ImportTooLarge as exc:
                raise CommandError(exc.message) from None
        for key, value in report.__dict__.items():
            self.stdout.write(f"{key}: {value}")
        self.stdout.write(self.style.SUCCESS(f"imported {report.items_created} item(s)"))
