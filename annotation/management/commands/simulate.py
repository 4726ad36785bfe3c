"""Drive the real REST API with a pool of simulated annotators (careful, noisy, bad actors)."""

from django.core.management.base import BaseCommand, CommandError

from annotation import services
from annotation.models import Membership, Project
from annotation.simulation import parse_pool, run_pool


class Command(BaseCommand):
    help = (
        "Label a project through the HTTP API with simulated annotators, e.g. "
        "`simulate --project 1 --pool careful:3,noisy:1,always_left:1,random:1 "
        "--url http://127.0.0.1:8000`."
    )

    def add_arguments(self, parser):
        parser.add_argument("--project", type=int, required=True)
        parser.add_argument(
            "--url",
            default="http://127.0.0.1:8000",
            help="Base URL of a running Prefloop web server.",
        )
        parser.add_argument(
            "--pool",
            default="careful:3,noisy:1,always_left:1,random:1",
            help="kind:count,... with kinds careful, noisy, biased, always_left, random.",
        )
        parser.add_argument(
            "--max-items",
            type=int,
            default=None,
            help="Stop each annotator after this many judgments.",
        )
        parser.add_argument(
            "--speedup",
            type=float,
            default=0.0,
            help="Sleep reported time / speedup per item (0: no sleep).",
        )
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, **options):
        project = Project.objects.filter(pk=options["project"]).first()
        if project is None:
            raise CommandError(f"No project {options['project']}.")
        try:
            pool = parse_pool(options["pool"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        annotators = []
        for i, (kind, profile) in enumerate(pool):
            token = services.simulated_annotator_ensure(project=project, username=f"sim-{kind}-{i}")
            annotators.append((f"sim-{kind}-{i}", token, profile))
        self.stdout.write(f"{len(annotators)} simulated annotators on {options['url']} ...")
        stats = run_pool(
            base_url=options["url"],
            project_id=project.pk,
            annotators=annotators,
            max_items=options["max_items"],
            speedup=options["speedup"],
            seed=options["seed"],
        )
        for s in stats:
            paused = Membership.objects.filter(
                project=project, user__username=s.name, status=Membership.Status.PAUSED
            ).exists()
            self.stdout.write(
                f"{s.name:24s} {s.behaviour:12s} submitted={s.submitted:5d} "
                f"retries={s.retries:3d} {'PAUSED ' if paused else ''}"
                f"{'; '.join(s.errors[:2])}"
            )
        if any(e for s in stats for e in s.errors if not e.startswith("next: paused")):
            raise CommandError("Some simulated annotators hit errors (see above).")
