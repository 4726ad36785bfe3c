"""A project's loop from the command line: status, next step, pause, resume, promote, settings."""

import json

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from annotation.errors import ServiceError
from annotation.models import Project
from training.loop import control
from training.loop.timeline import loop_timeline

ACTIONS = ("step", "status", "settings", "pause", "resume", "promote", "reject")


class Command(BaseCommand):
    help = (
        "Drive a project's loop: export -> train (DPO, or RM then PPO) -> evaluate -> gate -> "
        "generate -> open the next round. ACTION is one of: step (default: advance as far as "
        "it can go now; --sync runs every step here, else slow steps go to the gpu queue), "
        "status (the timeline), settings (show, or change with --set and --schedule), "
        "pause, resume, promote / reject (--model-version ID --reason TEXT --by USERNAME). "
        "The settings live on the project's loop; the first --set must choose 'path'."
    )

    def add_arguments(self, parser):
        parser.add_argument("action", nargs="?", default="step", choices=ACTIONS)
        parser.add_argument("--project", type=int, required=True)
        parser.add_argument(
            "--set",
            dest="loop_settings",
            metavar="JSON",
            help='LoopSettings fields to save first, e.g. \'{"path": "rm_ppo"}\'.',
        )
        parser.add_argument("--sync", action="store_true", help="step: run every step here.")
        parser.add_argument(
            "--force",
            action="store_true",
            help="step: start even if the round has fewer labels than required.",
        )
        parser.add_argument(
            "--schedule",
            type=int,
            metavar="SECONDS",
            help="Tick the loop every SECONDS with celery beat (saved with the settings).",
        )
        parser.add_argument("--pause", action="store_true", help="Same as the pause action.")
        parser.add_argument("--resume", action="store_true", help="Same as the resume action.")
        parser.add_argument("--model-version", type=int, help="promote / reject: the policy id.")
        parser.add_argument("--reason", default="", help="promote / reject: why (stored).")
        parser.add_argument(
            "--by", default="", help="promote / reject: the deciding user (staff or researcher)."
        )

    def handle(self, *args, **opts):
        project = Project.objects.filter(pk=opts["project"]).first()
        if project is None:
            raise CommandError(f"No project {opts['project']}.")
        action = opts["action"]
        if opts["pause"] or opts["resume"]:
            action = "pause" if opts["pause"] else "resume"
        try:
            self._settings(project, opts, show=action == "settings")
            if action == "settings":
                return
            if action == "step" and opts["schedule"] and not opts["sync"] and not opts["force"]:
                return  # only scheduling was asked (the former `--schedule N` alone)
            getattr(self, f"_{action}")(project, opts)
        except ServiceError as exc:
            raise CommandError(exc.message) from exc

    def _settings(self, project, opts, *, show: bool) -> None:
        if opts["loop_settings"] is not None or opts["schedule"]:
            try:
                values = json.loads(opts["loop_settings"] or "{}")
            except json.JSONDecodeError as exc:
                raise CommandError(f"Bad --set: not JSON ({exc}).") from exc
            control.loop_update(project=project, settings=values, every_seconds=opts["schedule"])
            if opts["schedule"]:
                self.stdout.write(f"scheduled the loop every {opts['schedule']} s")
            show = show or opts["loop_settings"] is not None
        if show:
            found = control.loop_get(project=project)
            self.stdout.write(json.dumps(found.config, indent=2, sort_keys=True))

    def _step(self, project, opts) -> None:
        control.loop_get(project=project)
        state = control.loop_tick_run(project_id=project.pk, sync=opts["sync"], force=opts["force"])
        for step in state.steps:
            self.stdout.write(f"{state.key} {step.name:9s} {step.status:8s} {step.detail}")
        if any(step.status == "failed" for step in state.steps):
            raise CommandError("A step failed; fix it and run again to retry that step alone.")

    def _status(self, project, opts) -> None:
        timeline = loop_timeline(project=project)
        if not timeline.has_loop:
            self.stdout.write("No loop yet: save its settings with --set '{\"path\": ...}'.")
        else:
            schedule = (
                f"every {timeline.every_seconds} s" if timeline.every_seconds else "not scheduled"
            )
            state = "paused" if timeline.paused else "running"
            self.stdout.write(
                f"loop of project {project.pk}: {state}, {schedule}; last tick "
                f"{timeline.last_tick_at or 'never'} {timeline.last_tick_status}"
            )
            if timeline.last_error:
                self.stdout.write(f"last error:\n{timeline.last_error.rstrip()}")
        for iteration in timeline.iterations:
            self.stdout.write(f"{iteration.key}")
            for step in iteration.steps:
                parts = [f"  {step.kind:10s} {step.title:32s} {step.status:10s}"]
                if step.progress is not None:
                    parts.append(f"{100 * step.progress:3.0f}%")
                if step.duration_seconds is not None:
                    parts.append(f"{step.duration_seconds:.1f} s")
                if step.detail:
                    parts.append(step.detail)
                self.stdout.write(" ".join(parts))
                if step.error:
                    self.stdout.write(f"    error: {step.error.strip().splitlines()[-1]}")

    def _pause(self, project, opts) -> None:
        control.loop_pause(project=project, paused=True)
        self.stdout.write("paused")

    def _resume(self, project, opts) -> None:
        control.loop_pause(project=project, paused=False)
        self.stdout.write("resumed")

    def _decide(self, project, opts, *, promote: bool) -> None:
        if not opts["model_version"] or not opts["by"]:
            raise CommandError("Give --model-version ID, --reason TEXT and --by USERNAME.")
        user = get_user_model().objects.filter(username=opts["by"]).first()
        if user is None:
            raise CommandError(f"--by: no user {opts['by']!r}.")
        version = control.loop_policy_for(
            project=project, version_id=opts["model_version"], user=user
        )
        version = control.loop_policy_decide(
            version=version, user=user, promote=promote, reason=opts["reason"]
        )
        self.stdout.write(f"model version {version.pk} {version.promotion}: {opts['reason']}")

    def _promote(self, project, opts) -> None:
        self._decide(project, opts, promote=True)

    def _reject(self, project, opts) -> None:
        self._decide(project, opts, promote=False)
