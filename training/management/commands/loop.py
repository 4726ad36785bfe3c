"""Run one loop iteration now, or schedule / pause a project's loop."""

import json

from django.core.management.base import BaseCommand, CommandError

from annotation.models import Project
from training import loop


class Command(BaseCommand):
    help = (
        "Close the loop for a project: export -> train (DPO, or RM then PPO) -> evaluate -> "
        "generate -> open the next round. `--sync` runs every step here; without it slow "
        "steps go to the gpu queue. `--schedule N` ticks it every N seconds with celery beat."
    )

    def add_arguments(self, parser):
        parser.add_argument("--project", type=int, required=True)
        parser.add_argument(
            "--settings",
            default="{}",
            help='JSON of LoopSettings fields, e.g. \'{"path": "rm_ppo"}\'.',
        )
        parser.add_argument("--sync", action="store_true", help="Run every step in-process.")
        parser.add_argument(
            "--force",
            action="store_true",
            help="Start even if the round has fewer labels than required.",
        )
        parser.add_argument(
            "--schedule",
            type=int,
            metavar="SECONDS",
            help="Create or update the beat schedule instead of running now.",
        )
        parser.add_argument("--pause", action="store_true", help="Pause the schedule.")
        parser.add_argument("--resume", action="store_true", help="Resume the schedule.")

    def handle(self, *args, **opts):
        project = Project.objects.filter(pk=opts["project"]).first()
        if project is None:
            raise CommandError(f"No project {opts['project']}.")
        try:
            settings = loop.LoopSettings.from_dict(json.loads(opts["settings"]))
        except (ValueError, TypeError) as exc:
            raise CommandError(f"Bad --settings: {exc}") from exc
        if opts["pause"] or opts["resume"]:
            if not loop.loop_schedule_pause(project=project, paused=opts["pause"]):
                raise CommandError("This project has no loop schedule.")
            self.stdout.write("paused" if opts["pause"] else "resumed")
            return
        if opts["schedule"]:
            task = loop.loop_schedule_set(
                project=project, settings=settings, every_seconds=opts["schedule"]
            )
            self.stdout.write(f"scheduled {task.name} every {opts['schedule']} s")
            return
        state = loop.loop_advance(
            project=project, settings=settings, sync=opts["sync"], force=opts["force"]
        )
        for step in state.steps:
            self.stdout.write(f"{state.key} {step.name:9s} {step.status:8s} {step.detail}")
        if any(step.status == "failed" for step in state.steps):
            raise CommandError("A step failed; fix it and run again to retry that step alone.")
