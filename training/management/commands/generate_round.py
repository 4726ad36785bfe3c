"""Generate a round for a project from registered policies, on the gpu queue or here (--sync)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from annotation.errors import ServiceError
from annotation.models import Project
from training import rounds


class Command(BaseCommand):
    help = (
        "Open a round of a project from its ready policies: K samples of one policy "
        "(--mode k_samples) or one answer of each of K policies (--mode side_by_side), on "
        "prompts of the project's prompt pool (train split; eval split with --purpose eval)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--project", type=int, required=True, help="Project id.")
        parser.add_argument(
            "--policy",
            type=int,
            action="append",
            required=True,
            help="Model version id of a ready policy of the project (repeat for side_by_side).",
        )
        parser.add_argument("--n-prompts", type=int, required=True, help="Prompts in the round.")
        parser.add_argument("--mode", choices=rounds.MODES, default="k_samples")
        parser.add_argument(
            "--temperature",
            type=float,
            action="append",
            default=None,
            help="Sampling temperature; once for every candidate, or once per candidate.",
        )
        parser.add_argument("--max-new-tokens", type=int, default=None)
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--purpose", choices=["train", "eval"], default="train")
        parser.add_argument("--source-key", default="", help="Idempotency key of the request.")
        parser.add_argument("--sync", action="store_true", help="Generate here, not queued.")

    def handle(self, *args, **options):
        project = Project.objects.filter(pk=options["project"]).first()
        if project is None:
            raise CommandError(f"--project: no project with id {options['project']}")
        temperatures = options["temperature"] or [None]
        sampling = []
        for temperature in temperatures:
            entry = {}
            if temperature is not None:
                entry["temperature"] = temperature
            if options["max_new_tokens"] is not None:
                entry["max_new_tokens"] = options["max_new_tokens"]
            sampling.append(entry)
        try:
            job = rounds.generation_job_create(
                project=project,
                user=None,
                policies=options["policy"],
                mode=options["mode"],
                n_prompts=options["n_prompts"],
                sampling=sampling,
                seed=options["seed"],
                purpose=options["purpose"],
                source_key=options["source_key"],
                enqueue=not options["sync"],
            )
        except ServiceError as exc:
            raise CommandError(exc.message) from None
        if not options["sync"]:
            self.stdout.write(f"generation job {job.pk} queued on the gpu queue")
            return
        job = rounds.generation_job_run(job_id=job.pk)
        if job.status != job.Status.SUCCEEDED:
            raise CommandError(f"generation job {job.pk} failed: {job.error}")
        self.stdout.write(
            self.style.SUCCESS(
                f"generation job {job.pk}: round {job.round.number} with {job.n_items} item(s)"
            )
        )
