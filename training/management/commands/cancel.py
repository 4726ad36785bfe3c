"""Cancel a training run and kill its training process."""

from django.core.management.base import BaseCommand, CommandError

from annotation.errors import ServiceError
from training import services


class Command(BaseCommand):
    help = "Cancel a queued or running training run."

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=int)

    def handle(self, *args, **options):
        try:
            run = services.training_run_cancel(run_id=options["run_id"])
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"run {run.pk}: {run.status}")
