"""Export a project's judgments as a versioned dataset snapshot (JSONL + HF datasets folder)."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError
from tqdm import tqdm

from annotation import exports, tasks
from annotation.errors import ServiceError
from annotation.management.commands.import_items import project_from_arg
from annotation.models import Judgment


def _split(value: str) -> dict:
    parts = [float(p) for p in value.split(",")]
    if len(parts) not in (1, 2, 3):
        raise CommandError("--split takes 1 to 3 comma-separated fractions (train,val,test)")
    return dict(zip(("train", "validation", "test"), parts, strict=False))


class Command(BaseCommand):
    help = (
        "Export judgments as an immutable snapshot under ARTIFACT_ROOT/datasets/<project>/"
        "<version>/ (train/validation/test.jsonl, manifest.json, hf/). Every policy is "
        "recorded in the manifest; see annotation/exports/ (policy.py) for their meaning."
    )

    def add_arguments(self, parser):
        parser.add_argument("project", help="Project id or name.")
        parser.add_argument("--name", default="")
        parser.add_argument("--format", choices=exports.FORMATS, default="trl")
        parser.add_argument(
            "--conversational", choices=["auto", "yes", "no"], default="auto",
            help="TRL rows as chat messages (auto: when any prompt is a chat transcript).",
        )  # fmt: skip
        parser.add_argument("--aggregation", choices=exports.AGGREGATIONS, default="per_judgment")
        parser.add_argument("--ties", choices=exports.TIE_POLICIES, default="drop")
        parser.add_argument("--both-bad", choices=exports.BOTH_BAD_POLICIES, default="drop")
        parser.add_argument("--min-agreement", type=float, default=0.0)
        parser.add_argument("--min-votes", type=int, default=1)
        parser.add_argument(
            "--sources", default="human",
            help="Comma-separated label sources (human, imported, ai, simulated).",
        )  # fmt: skip
        parser.add_argument("--include-gold", action="store_true", default=None)
        parser.add_argument("--include-repeats", action="store_true", default=None)
        parser.add_argument("--include-qc-flagged", action="store_true", default=None)
        parser.add_argument("--margin-slightly", type=float, default=1.0)
        parser.add_argument("--margin-much", type=float, default=2.0)
        parser.add_argument("--split", default="0.9,0.05,0.05", help="train,validation,test")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--group-by", choices=exports.GROUP_BY, default="prompt")
        parser.add_argument(
            "--near-duplicates", choices=exports.NEAR_DUPLICATES, default="off",
            help="report near-duplicate prompts, or also keep them in one split (group).",
        )  # fmt: skip
        parser.add_argument("--no-merge-duplicate-pairs", action="store_true")
        parser.add_argument("--rounds", default="", help="Comma-separated round numbers.")
        parser.add_argument("--no-hf", action="store_true", help="Skip the HF datasets folder.")
        parser.add_argument(
            "--async", dest="run_async", action="store_true", help="Queue a Celery task."
        )
        parser.add_argument("--no-progress", action="store_true")

    def handle(self, *args, **options):
        project = project_from_arg(options["project"])
        policy = {
            "format": options["format"],
            "conversational": {"auto": None, "yes": True, "no": False}[options["conversational"]],
            "aggregation": options["aggregation"],
            "ties": options["ties"],
            "both_bad": options["both_bad"],
            "min_agreement": options["min_agreement"],
            "min_votes": options["min_votes"],
            "sources": [s.strip() for s in options["sources"].split(",") if s.strip()],
            "include_gold": options["include_gold"],
            "include_repeats": options["include_repeats"],
            "include_qc_flagged": options["include_qc_flagged"],
            "margins": {"slightly": options["margin_slightly"], "much": options["margin_much"]},
            "split": _split(options["split"]),
            "seed": options["seed"],
            "group_by": options["group_by"],
            "near_duplicates": options["near_duplicates"],
            "merge_duplicate_pairs": not options["no_merge_duplicate_pairs"],
            "rounds": [int(r) for r in options["rounds"].split(",") if r.strip()] or None,
            "hf": not options["no_hf"],
        }
        try:
            if options["run_async"]:
                dv = exports.dataset_version_create(
                    project=project, policy=policy, name=options["name"]
                )
                tasks.build_dataset_version_on_commit(dv.pk)
                self.stdout.write(f"queued dataset version {dv.version} (id {dv.pk})")
                return
            total = Judgment.objects.filter(project=project).count()
            with tqdm(
                total=total,
                unit=" judgments",
                disable=options["no_progress"],
                file=self.stderr,
            ) as bar:
                dv = exports.dataset_version_export(
                    project=project, policy=policy, name=options["name"], progress=bar.update
                )
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(json.dumps(dv.report, indent=2, ensure_ascii=False))
        self.stdout.write(
            self.style.SUCCESS(
                f"dataset v{dv.version}: {dv.split_counts} rows, hash {dv.content_hash} "
                f"at {dv.path}"
            )
        )
