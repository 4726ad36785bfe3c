"""An LLM behind a declared OpenAI-compatible endpoint labels a project through the HTTP API,
as an AI annotator (source "ai"), asking each pair in both display orders."""

import json
from pathlib import Path

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from annotation import services
from annotation.errors import ServiceError
from annotation.models import LabelSource, Project
from training.judging import DISAGREEMENT_POLICIES, JudgeError, LLMJudge
from training.llm_annotator import llm_annotator_username, run_llm_annotator


class Command(BaseCommand):
    help = (
        "Label a project's open items with an LLM judge through the HTTP API, e.g. "
        "`llm_annotate --project 1 --endpoint hosted --model judge-model "
        "--url http://127.0.0.1:8000`. The endpoint is one the deployment declares in "
        "PREFLOOP_GENERATION_ENDPOINTS; the instruction is the project's rubric. Each pair is "
        "asked in both orders; when they disagree the item is a tie or skipped "
        "(--on-disagreement). Labels carry source 'ai' and the account is named after the "
        "judge; every request and reply is appended to an audit log (JSON lines)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--project", type=int, required=True)
        parser.add_argument(
            "--endpoint", required=True, help="A name from PREFLOOP_GENERATION_ENDPOINTS."
        )
        parser.add_argument("--model", required=True, help="One of that endpoint's models.")
        parser.add_argument(
            "--on-disagreement",
            choices=DISAGREEMENT_POLICIES,
            default="tie",
            help="When the two display orders disagree or a reply has no verdict: label a tie "
            "(skipped where the project offers no tie) or skip the item.",
        )
        parser.add_argument(
            "--url", default="http://127.0.0.1:8000", help="Base URL of a running Prefloop."
        )
        parser.add_argument(
            "--max-items", type=int, default=None, help="Stop after this many items."
        )
        parser.add_argument(
            "--max-new-tokens", type=int, default=512, help="Longest judge reply in tokens."
        )
        parser.add_argument(
            "--audit-log",
            default=None,
            help="JSON-lines file the judge's requests and replies are appended to "
            "(default: ARTIFACT_ROOT/llm_judges/project-<id>/<account>.jsonl).",
        )

    def handle(self, *args, **options):
        project = Project.objects.filter(pk=options["project"]).first()
        if project is None:
            raise CommandError(f"No project {options['project']}.")
        try:
            judge = LLMJudge(
                endpoint=options["endpoint"],
                model=options["model"],
                on_disagreement=options["on_disagreement"],
                max_new_tokens=options["max_new_tokens"],
            )
        except (ServiceError, JudgeError) as exc:
            raise CommandError(getattr(exc, "message", str(exc))) from exc
        username = llm_annotator_username(endpoint=judge.endpoint, model=judge.model)
        token = services.simulated_annotator_ensure(
            project=project, username=username, source=LabelSource.AI
        )
        # The account's full name says which judge it is (the username is shortened).
        get_user_model().objects.filter(username=username).update(
            last_name=f"LLM judge {judge.name}"[:150]
        )
        audit = Path(
            options["audit_log"]
            or Path(settings.ARTIFACT_ROOT) / "llm_judges" / f"project-{project.pk}" / username
        )
        if audit.suffix != ".jsonl":
            audit = audit.with_name(audit.name + ".jsonl")
        audit.parent.mkdir(parents=True, exist_ok=True)
        self.stdout.write(f"{username} ({judge.name}) labels project {project.pk} ...")
        with audit.open("a", encoding="utf-8") as log:

            def record(entry: dict) -> None:
                log.write(json.dumps(entry) + "\n")
                log.flush()

            try:
                stats = run_llm_annotator(
                    base_url=options["url"],
                    token=token,
                    project_id=project.pk,
                    judge=judge,
                    username=username,
                    max_items=options["max_items"],
                    record=record,
                )
            except JudgeError as exc:
                raise CommandError(
                    f"The LLM judge failed; nothing was submitted for the item it was on: {exc}"
                ) from exc
            except requests.RequestException as exc:
                raise CommandError(
                    f"Prefloop does not answer at {options['url']} ({type(exc).__name__})."
                ) from exc
        outcomes = ", ".join(f"{k}={v}" for k, v in sorted(stats.outcomes.items())) or "none"
        self.stdout.write(
            f"submitted={stats.submitted} skipped={stats.skipped} comparisons: {outcomes}; "
            f"audit log: {audit}"
        )
        if stats.errors:
            raise CommandError(f"{username}: {'; '.join(stats.errors)}")
