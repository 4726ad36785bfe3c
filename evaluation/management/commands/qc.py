"""Run a project's quality-control check now: assess annotators, mark disputes, agreement."""

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from annotation.models import Project
from evaluation import services
from evaluation.models import AnnotatorAssessment


class Command(BaseCommand):
    help = (
        "Assess every active annotator of a project, queue disputed items for review and "
        "store an agreement report. Without --pause it is a dry run for annotators: verdicts "
        "are stored and printed, nobody is paused."
    )

    def add_arguments(self, parser):
        parser.add_argument("--project", type=int, required=True)
        parser.add_argument(
            "--pause", action="store_true", help="Pause annotators who fail a check."
        )
        parser.add_argument(
            "--n-boot", type=int, default=1000, help="Bootstrap replicates for the agreement."
        )
        parser.add_argument(
            "--no-agreement", action="store_true", help="Skip the agreement report."
        )

    def handle(self, *args, **options):
        project = Project.objects.filter(pk=options["project"]).first()
        if project is None:
            raise CommandError(f"No project {options['project']}.")
        if options["n_boot"] < 0:
            raise CommandError("--n-boot must be at least 0.")

        def progress(rows):
            return tqdm(rows, desc="annotators", unit="annotator", file=self.stderr)

        result = services.qc_check_project(
            project=project,
            pause=options["pause"],
            trigger=AnnotatorAssessment.Trigger.COMMAND,
            agreement=not options["no_agreement"],
            n_boot=options["n_boot"],
            progress=progress,
        )
        for assessment in result.assessments:
            action = "PAUSED" if assessment.applied else assessment.verdict
            line = f"{assessment.annotator.username:24s} {action:8s} n={assessment.n_judgments}"
            if assessment.reasons:
                line += "  " + "; ".join(assessment.reasons)
            self.stdout.write(line)
        self.stdout.write(
            f"{len(result.assessments)} assessed, {len(result.paused)} paused, "
            f"{result.items_marked} items queued for review."
        )
        if result.agreement is not None:
            for source, block in result.agreement.report["by_source"].items():
                alpha = block["alpha"]
                if alpha and alpha["estimate"] is not None:
                    self.stdout.write(
                        f"{source}: alpha {alpha['estimate']:.3f} "
                        f"[{_fmt(alpha['low'])}, {_fmt(alpha['high'])}] "
                        f"on {block['n_items']} items"
                    )
                else:
                    self.stdout.write(f"{source}: alpha n/a on {block['n_items']} items")


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"
