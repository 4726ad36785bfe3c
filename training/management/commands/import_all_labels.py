"""Load a file written by `export_all_labels` into an empty instance, in one transaction.

Rows get new ids; every reference in the file (original ids) is mapped to the new ones.
People are matched by username; a username this instance lacks becomes an inactive
placeholder account with no usable password (reactivate it, or let the person reset it).
Model versions are matched by name. A file without its "end" line, or whose counts differ
from that line, is refused and nothing is written.
"""

import json
import sys
from collections import defaultdict

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import models, transaction

from annotation.models import Judgment, Membership, Project
from training.management.commands.export_all_labels import (
    FORMAT,
    FORMAT_VERSION,
    KINDS,
    Kind,
    exported_fields,
    is_user_field,
    open_text,
)

BATCH = 1000
KIND_BY_TYPE = {kind.type: kind for kind in KINDS}
TYPE_BY_MODEL = {kind.model: kind.type for kind in KINDS}


class LabelImportError(Exception):
    """The file cannot be imported; nothing was written."""


def instance_is_empty() -> bool:
    """Return whether the instance holds no projects, memberships or judgments."""
    return not (
        Project.objects.exists() or Membership.objects.exists() or Judgment.objects.exists()
    )


class _Loader:
    """Create rows kind by kind in batches, keeping old id -> new id for every kind."""

    def __init__(self):
        self.ids: dict[str, dict[int, int]] = defaultdict(dict)
        self.users: dict[str, int] = {}
        self.placeholders = 0
        self.kind: Kind | None = None
        self.batch: list[tuple[int, models.Model, dict]] = []
        # (row, attname, old id of a row of the same kind), set once the kind is complete.
        self.self_links: list[tuple[models.Model, str, int]] = []
        self.counts: dict[str, int] = defaultdict(int)

    def user_id(self, username: str) -> int:
        if username not in self.users:
            user_model = get_user_model()
            user = user_model._default_manager.filter(
                **{user_model.USERNAME_FIELD: username}
            ).first()
            if user is None:
                user = user_model(**{user_model.USERNAME_FIELD: username}, is_active=False)
                user.set_unusable_password()
                user.save()
                self.placeholders += 1
            self.users[username] = user.pk
        return self.users[username]

    def add(self, kind: Kind, row: dict, lineno: int) -> None:
        if kind is not self.kind:
            self.finish_kind()
            self.kind = kind
        self.counts[kind.type] += 1
        model = kind.model
        pk_name = model._meta.pk.name
        if pk_name not in row:
            raise LabelImportError(f"line {lineno}: {kind.type} without {pk_name!r}.")
        old_id = row[pk_name]
        fields = {f.name: f for f in exported_fields(kind) if f.name != pk_name}
        unknown = set(row) - set(fields) - {pk_name, "type"}
        if unknown:
            raise LabelImportError(
                f"line {lineno}: {kind.type} has fields this version does not know: "
                f"{', '.join(sorted(unknown))}."
            )
        if kind.type == "model_version":
            existing = model._default_manager.filter(name=row.get("name")).first()
            if existing is not None:
                self.ids[kind.type][old_id] = existing.pk
                return
        values, auto, self_links = {}, {}, []
        for name, field in fields.items():
            if name not in row:
                continue
            value = row[name]
            if is_user_field(field):
                values[field.attname] = None if value is None else self.user_id(value)
            elif field.is_relation:
                values[field.attname] = self._link(kind, field, value, lineno, self_links)
            else:
                try:
                    values[field.attname] = field.to_python(value)
                except Exception as exc:
                    raise LabelImportError(f"line {lineno}: {kind.type}.{name}: {exc}") from exc
            if getattr(field, "auto_now_add", False) or getattr(field, "auto_now", False):
                auto[field.attname] = values[field.attname]
        instance = model(**values)
        self.self_links.extend((instance, attname, ref) for attname, ref in self_links)
        self.batch.append((old_id, instance, auto))
        if len(self.batch) >= BATCH:
            self.flush()

    def _link(self, kind: Kind, field, value, lineno: int, self_links: list):
        if value is None:
            return None
        target = TYPE_BY_MODEL.get(field.related_model)
        if target is None:
            if field.null:
                return None
            raise LabelImportError(
                f"line {lineno}: {kind.type}.{field.name} refers to a row the file cannot hold."
            )
        if target == kind.type:
            self_links.append((field.attname, value))
            return None
        try:
            return self.ids[target][value]
        except KeyError:
            raise LabelImportError(
                f"line {lineno}: {kind.type}.{field.name} refers to {target} {value}, "
                "which is not earlier in the file."
            ) from None

    def flush(self) -> None:
        if not self.batch:
            return
        instances = [instance for _, instance, _ in self.batch]
        self.kind.model._default_manager.bulk_create(instances)
        # bulk_create stamps auto_now(_add) fields with the current time; put the originals back.
        auto_fields = sorted({name for _, _, auto in self.batch for name in auto})
        if auto_fields:
            for _, instance, auto in self.batch:
                for name, value in auto.items():
                    setattr(instance, name, value)
            self.kind.model._default_manager.bulk_update(instances, auto_fields)
        for old_id, instance, _ in self.batch:
            self.ids[self.kind.type][old_id] = instance.pk
        self.batch = []

    def finish_kind(self) -> None:
        self.flush()
        if not self.self_links:
            return
        by_field = defaultdict(list)
        for instance, attname, ref in self.self_links:
            try:
                setattr(instance, attname, self.ids[self.kind.type][ref])
            except KeyError:
                raise LabelImportError(
                    f"{self.kind.type} {instance.pk} refers to {self.kind.type} {ref}, "
                    "which is not in the file."
                ) from None
            by_field[attname].append(instance)
        for attname, instances in by_field.items():
            self.kind.model._default_manager.bulk_update(instances, [attname], batch_size=BATCH)
        self.self_links = []


def labels_import(lines, *, force: bool = False) -> dict:
    """Import an export_all_labels stream; return the counts. Call inside a transaction."""
    if not force and not instance_is_empty():
        raise LabelImportError(
            "This instance already has projects or labels; import into an empty one, "
            "or pass --force to add to it."
        )
    loader = _Loader()
    expected = None
    lineno = 0
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if expected is not None:
            raise LabelImportError(f"line {lineno}: data after the end line.")
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise LabelImportError(f"line {lineno}: not JSON ({exc}).") from exc
        kind_name = row.get("type") if isinstance(row, dict) else None
        if lineno == 1:
            if kind_name != "meta" or row.get("format") != FORMAT:
                raise LabelImportError("line 1: not a prefloop-labels file.")
            if row.get("version", 0) > FORMAT_VERSION:
                raise LabelImportError(
                    f"The file is format version {row['version']}; this code reads up to "
                    f"{FORMAT_VERSION}."
                )
            continue
        if kind_name == "end":
            expected = row.get("counts", {})
            continue
        if kind_name not in KIND_BY_TYPE:
            raise LabelImportError(f"line {lineno}: unknown type {kind_name!r}.")
        loader.add(KIND_BY_TYPE[kind_name], row, lineno)
    loader.finish_kind()
    if lineno == 0:
        raise LabelImportError("The file is empty.")
    if expected is None:
        raise LabelImportError("The file has no end line: it is truncated.")
    got = {kind.type: loader.counts.get(kind.type, 0) for kind in KINDS}
    missing = {t: n for t, n in expected.items() if got.get(t, 0) != n}
    if missing:
        raise LabelImportError(
            f"Counts differ from the end line: the file says {expected}, it holds {got}."
        )
    return {**got, "placeholder_users": loader.placeholders}


class Command(BaseCommand):
    help = (
        "Import labels written by export_all_labels into an empty instance, atomically; "
        "missing users become inactive placeholders. `import_all_labels labels.jsonl.gz`."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", help="File to read ('-' for stdin; .gz is decompressed).")
        parser.add_argument(
            "--force",
            action="store_true",
            help="Import even if the instance already has projects (names must not clash).",
        )

    def handle(self, *args, **options):
        path = options["path"]
        try:
            with transaction.atomic():
                if path == "-":
                    counts = labels_import(sys.stdin, force=options["force"])
                else:
                    with open_text(path, "r") as stream:
                        counts = labels_import(stream, force=options["force"])
        except FileNotFoundError as exc:
            raise CommandError(f"No such file: {path}") from exc
        except LabelImportError as exc:
            raise CommandError(f"{exc} Nothing was imported.") from exc
        except Exception as exc:
            # Constraint violations and the like: the transaction is rolled back.
            raise CommandError(f"Import failed, nothing was imported: {exc}") from exc
        summary = ", ".join(f"{n} {t}" for t, n in counts.items())
        self.stdout.write(f"Imported {summary}.")
