"""Write every label with its context as JSONL: the portable, long-term backup of the labels.

One JSON object per line, each with a "type": first a "meta" line, then every project,
membership, model version, round, prompt, candidate (with generation metadata), item,
item slot, assignment (with its display order), skip, judgment (raw votes) and
adjudication, in that order and by id, then an "end" line with the counts. Every row
carries all its columns and its original id; references to people are usernames, other
references are the original ids of rows earlier in the file. `import_all_labels` reads it.
Rows are streamed with `.iterator()`, so memory stays flat however many labels there are.
"""

import datetime
import decimal
import gzip
import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import models
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

from annotation.models import (
    Adjudication,
    Assignment,
    Candidate,
    Item,
    ItemCandidate,
    Judgment,
    Membership,
    Project,
    Prompt,
    Round,
    Skip,
)
from training.models import ModelVersion

FORMAT = "prefloop-labels"
FORMAT_VERSION = 1
CHUNK = 2000


@dataclass(frozen=True)
class Kind:
    """One row type of the file: its model and the fields never carried over."""

    type: str
    model: type[models.Model]
    # Links to rows this file does not hold (training runs, dataset snapshots): left empty.
    dropped: tuple[str, ...] = ()


# Dependency order: a row only refers to users or to rows of earlier kinds (or its own kind).
KINDS = (
    Kind("project", Project),
    Kind("membership", Membership),
    Kind("model_version", ModelVersion, dropped=("training_run", "dataset_version")),
    Kind("round", Round),
    Kind("prompt", Prompt),
    Kind("candidate", Candidate),
    Kind("item", Item),
    Kind("item_candidate", ItemCandidate),
    Kind("assignment", Assignment),
    Kind("skip", Skip),
    Kind("judgment", Judgment),
    Kind("adjudication", Adjudication),
)


def is_user_field(field: models.Field) -> bool:
    return field.is_relation and field.related_model is get_user_model()


def exported_fields(kind: Kind) -> list[models.Field]:
    """Return the columns written for a kind: every concrete field except dropped links."""
    return [f for f in kind.model._meta.concrete_fields if f.name not in kind.dropped]


def _json_default(value):
    # Full precision: DjangoJSONEncoder would cut datetimes to milliseconds.
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def dumps(obj: dict) -> str:
    return json.dumps(obj, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def rows(kind: Kind) -> Iterator[dict]:
    """Yield one dict per row of a kind, by id; user links become usernames."""
    columns = {}
    for field in exported_fields(kind):
        if is_user_field(field):
            columns[field.name] = f"{field.name}__{get_user_model().USERNAME_FIELD}"
        else:
            columns[field.name] = field.attname
    queryset = kind.model._default_manager.order_by("pk").values(*columns.values())
    for values in queryset.iterator(chunk_size=CHUNK):
        yield {"type": kind.type, **{name: values[col] for name, col in columns.items()}}


def labels_export(stream) -> dict[str, int]:
    """Write the whole label set to a text stream; return the count of rows per type."""
    applied = MigrationRecorder.Migration.objects.order_by("applied", "id")
    migrations = {}
    for app, name in applied.values_list("app", "name"):
        migrations[app] = name
    meta = {
        "type": "meta",
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported_at": timezone.now(),
        "migrations": {app: migrations.get(app) for app in ("annotation", "training")},
    }
    stream.write(dumps(meta) + "\n")
    counts = {}
    for kind in KINDS:
        counts[kind.type] = 0
        for row in rows(kind):
            stream.write(dumps(row) + "\n")
            counts[kind.type] += 1
    stream.write(dumps({"type": "end", "counts": counts}) + "\n")
    return counts


def open_text(path: str | Path, mode: str, *, compress: bool | None = None):
    """Open a file for text; gzip when `compress`, by default when the name ends in .gz."""
    if compress is None:
        compress = str(path).endswith(".gz")
    if compress:
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8")


class Command(BaseCommand):
    help = (
        "Export every project, round, prompt, candidate, item, assignment and judgment (raw "
        "votes) as JSONL, e.g. `export_all_labels --output labels.jsonl.gz`."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--output",
            default="-",
            help="File to write ('-' for stdout; a name ending in .gz is compressed).",
        )

    def handle(self, *args, **options):
        path = options["output"]
        if path == "-":
            labels_export(self.stdout)
            return
        # Written beside the target and renamed at the end: a crash leaves no half file.
        partial = Path(f"{path}.partial")
        partial.parent.mkdir(parents=True, exist_ok=True)
        with open_text(partial, "w", compress=path.endswith(".gz")) as out:
            counts = labels_export(out)
        os.replace(partial, path)
        summary = ", ".join(f"{n} {t}" for t, n in counts.items())
        self.stderr.write(f"Wrote {path}: {summary}.")
