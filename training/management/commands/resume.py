"""Resume a failed, cancelled or orphaned training run from its newest checkpoint."""

from django.core.management.base import BaseCommand, CommandError

from annotation.errors import ServiceError
from training import services
from training.management.commands._progress import run_sync


class Command(BaseCommand):
    help = "Re-queue a training run (or run it here with --sync); it resumes from a checkpoint."

    def add_arguments(self, parser):
        parser.add_argument("run_id", type=int)
        parser.add_argument(
            "--sync", action="store_true", help="train in this process, without a worker"
        )

    def handle(self, *args, **options):
        try:
            run = services.training_run_resume(
                run_id=options["run_id"], enqueue=not options["sync"]
            )
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
        if not options["sync"]:
            self.stdout.write(f"run {run.pk} queued again")
            return
        run_sync(self, run.pk)
