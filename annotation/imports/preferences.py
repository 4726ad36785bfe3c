"""Import existing preference data as items plus `imported` judgments: validated, then atomic.

The line formats are read by `annotation.imports.preference_lines`. The same prompt with the
same answers (in either order) becomes one item in the round, and each line's label a
judgment on it: duplicates are counted, never dropped silently. Each judgment's
``idempotency_key`` is ``import:<batch>:<line>``; importing a batch twice is refused.

Two streaming passes, bounded like `annotation.imports.limits.bounded_lines`: the first
validates every line (and hashes the file for the default batch name), the second writes in
batches inside one transaction.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from django.db import transaction

from annotation.dedup import DedupTracker, MinHasher, key64, pair_key
from annotation.errors import Conflict
from annotation.imports.formats import content_hash
from annotation.imports.items import candidates_get_or_create, prompts_get_or_create
from annotation.imports.limits import BATCH, MAX_ERRORS_REPORTED, ImportFailed
from annotation.imports.preference_lines import (
    BATCH_NAME,
    FORMATS,
    canonical,
    lines_read,
    parse_line,
)
from annotation.labels import pair_outcome
from annotation.models import (
    Item,
    ItemCandidate,
    Judgment,
    LabelSource,
    Project,
    Round,
    TaskKind,
)
from annotation.rounds import round_close, round_create


@dataclass
class PreferenceImportReport:
    batch: str = ""
    round_id: int | None = None
    round_number: int | None = None
    lines: int = 0
    items_created: int = 0
    items_reused: int = 0
    judgments_created: int = 0
    prompts_created: int = 0
    prompts_reused: int = 0
    candidates_created: int = 0
    candidates_reused: int = 0
    pairs_in_other_rounds: int = 0
    labels: dict = field(default_factory=dict)
    ignored_fields: dict = field(default_factory=dict)
    dedup: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """Return the report as plain JSON-serialisable data."""
        return dict(self.__dict__)


def _check_file(
    *, project: Project, stream: IO, fmt: str, batch: str, near_duplicates: bool, progress
) -> PreferenceImportReport:
    """Read every line once: raise ImportFailed listing each bad one, else report the file."""
    report = PreferenceImportReport()
    errors: list[tuple[int, str]] = []
    total_bad = 0
    file_hash = hashlib.sha256()
    tracker = DedupTracker(near_duplicates=MinHasher() if near_duplicates else None)
    ignored: Counter = Counter()
    labels: Counter = Counter()
    seen_ids: set[str] = set()
    for number, row, parse_error, raw in lines_read(stream):
        file_hash.update(raw.rstrip(b"\r\n") + b"\n")
        report.lines += 1
        if parse_error:
            record, problems, extra = None, [parse_error], set()
        else:
            record, problems, extra = parse_line(row, fmt=fmt, project=project)
        ignored.update(extra)
        if record is not None and record["id"]:
            if record["id"] in seen_ids:
                problems = [f"duplicate id {record['id']!r} in file"]
                record = None
            else:
                seen_ids.add(record["id"])
        if record is None:
            total_bad += 1
            if len(errors) < MAX_ERRORS_REPORTED:
                errors.extend((number, p) for p in problems)
        else:
            cands, hashes, choice, _ = canonical(record)
            payload = record.get("prompt") or record.get("messages")
            phash = content_hash(payload)
            where = f"line {number}"
            if not tracker.see_prompt(phash, payload, where):
                tracker.see_near_prompt(where, payload, where)
            for c, h in zip(cands, hashes, strict=True):
                tracker.see_response(phash, h, c["text"], where)
            if len(hashes) == 2:
                tracker.see_pair(phash, hashes[0], hashes[1], where)
            labels[choice or "ranking"] += 1
        if progress and number % 1000 == 0:
            progress(1000)
    if total_bad:
        raise ImportFailed(errors, total_bad)
    if not report.lines:
        raise ImportFailed([(0, "the file holds no rows")], 1)
    report.batch = batch or file_hash.hexdigest()[:12]
    report.labels = dict(labels)
    report.ignored_fields = dict(ignored)
    report.dedup = tracker.report()
    del tracker, seen_ids
    return report


def preferences_import(
    *,
    project: Project,
    stream: IO,
    fmt: str,
    batch: str = "",
    round_: Round | None = None,
    serve: bool = False,
    near_duplicates: bool = False,
    progress: Callable[[int], None] | None = None,
) -> PreferenceImportReport:
    """Validate a whole preference file, then write its items and judgments atomically.

    Without ``round_`` a new round is opened for the batch and closed after the import
    (unless ``serve``), so the imported items are not handed to annotators.
    ``progress(n)`` is called with the number of lines just handled, in both passes.
    """
    if fmt not in FORMATS:
        raise ImportFailed([(0, f"format must be one of {', '.join(FORMATS)}")], 1)
    if fmt in ("hh", "trl") and project.k != 2:
        raise ImportFailed([(0, f"{fmt} pairs need a project with k = 2")], 1)
    if batch and not BATCH_NAME.match(batch):
        raise ImportFailed([(0, "batch must be 1-60 letters, digits, '.', '-' or '_'")], 1)

    # Pass 1: validate every line, hash the file, count duplicates.
    report = _check_file(
        project=project,
        stream=stream,
        fmt=fmt,
        batch=batch,
        near_duplicates=near_duplicates,
        progress=progress,
    )
    key_prefix = f"import:{report.batch}:"
    if Judgment.objects.filter(project=project, idempotency_key__startswith=key_prefix).exists():
        raise Conflict(f"batch {report.batch!r} was already imported.", code="already_imported")

    # Pass 2: write in batches, in one transaction.
    with transaction.atomic():
        target = round_ or round_create(project=project, source_key=f"import:{report.batch}")
        report.round_id, report.round_number = target.pk, target.number
        chunk: list[tuple[int, dict]] = []
        for number, row, _, _ in lines_read(stream):
            chunk.append((number, parse_line(row, fmt=fmt, project=project)[0]))
            if len(chunk) >= BATCH:
                _write_chunk(project, target, chunk, report, key_prefix)
                if progress:
                    progress(len(chunk))
                chunk = []
        if chunk:
            _write_chunk(project, target, chunk, report, key_prefix)
            if progress:
                progress(len(chunk))
        if round_ is None and not serve:
            round_close(round_=target)
    return report


def _item_keys(*, project: Project, prompt_ids: set[int], round_: Round) -> dict:
    """Return {pair or ranking key: (item id, round id)} for items of these prompts."""
    slots: dict[int, list] = {}
    rows = (
        ItemCandidate.objects.filter(item__project=project, item__prompt_id__in=prompt_ids)
        .order_by("item_id", "position")
        .values_list(
            "item_id", "item__round_id", "item__prompt__content_hash", "candidate__content_hash"
        )
    )
    for item_id, round_id, phash, chash in rows:
        slots.setdefault(item_id, [round_id, phash, []])[2].append(chash)
    keys: dict = {}
    for item_id, (round_id, phash, hashes) in slots.items():
        key = _item_key(phash, hashes)
        current = keys.get(key)
        if current is None or (current[1] != round_.pk and round_id == round_.pk):
            keys[key] = (item_id, round_id)
    return keys


def _item_key(phash: str, hashes: list[str]) -> tuple:
    if len(hashes) == 2:
        return pair_key(phash, hashes[0], hashes[1])
    return (key64(phash), *(key64(h) for h in hashes))


def _blank_taken_external_ids(round_: Round, items: list[Item]) -> None:
    """Blank the external id of a new item whose id an earlier item of the round holds."""
    ext_ids = [item.external_id for item in items if item.external_id]
    taken = set(
        Item.objects.filter(round=round_, external_id__in=ext_ids).values_list(
            "external_id", flat=True
        )
    )
    seen_ext: set[str] = set()
    for item in items:
        if item.external_id in taken or item.external_id in seen_ext:
            item.external_id = ""
        seen_ext.add(item.external_id)


def _write_chunk(
    project: Project,
    round_: Round,
    chunk: list[tuple[int, dict]],
    report: PreferenceImportReport,
    key_prefix: str,
) -> None:
    canon = []
    prompt_rows: dict[str, dict] = {}
    for number, record in chunk:
        payload = record.get("prompt") or record.get("messages")
        phash = content_hash(payload)
        prompt_rows.setdefault(phash, record)
        canon.append((number, record, phash, *canonical(record)))
    prompts, created = prompts_get_or_create(project=project, rows=prompt_rows)
    report.prompts_created += created
    report.prompts_reused += len(chunk) - created
    cand_keys = [
        (prompts[phash].pk, h, c.get("model_name", ""), c)
        for _, _, phash, cands, hashes, _, _ in canon
        for c, h in zip(cands, hashes, strict=True)
    ]
    found, created_c, reused_c = candidates_get_or_create(keys=cand_keys)
    report.candidates_created += created_c
    report.candidates_reused += reused_c

    existing = _item_keys(
        project=project, prompt_ids={p.pk for p in prompts.values()}, round_=round_
    )
    new_items: dict[tuple, tuple[Item, list]] = {}
    judgments: list[tuple[tuple, Judgment, tuple | None]] = []
    for number, record, phash, cands, hashes, choice, ranking in canon:
        prompt = prompts[phash]
        key = _item_key(phash, hashes)
        hit = existing.get(key)
        if hit is not None and hit[1] != round_.pk:
            report.pairs_in_other_rounds += 1
            hit = None
        if hit is not None or key in new_items:
            report.items_reused += 1
        else:
            item = Item(project=project, round=round_, prompt=prompt, external_id=record["id"])
            slots = [
                found[(prompt.pk, h, c.get("model_name", ""))]
                for c, h in zip(cands, hashes, strict=True)
            ]
            new_items[key] = (item, slots)
        if project.task_kind == TaskKind.PAIRWISE and ranking is not None:
            choice = pair_outcome(ranking, 0, 1)
            ranking = None
        elif project.task_kind == TaskKind.RANKING and choice is not None:
            ranking = [1, 2] if choice == "A" else [2, 1]
            choice = None
        judgment = Judgment(
            project=project,
            external_rater=record["rater"] or key_prefix.rstrip(":"),
            choice=choice or "",
            ranking=ranking,
            strength=record["strength"],
            confidence=record["confidence"],
            idempotency_key=f"{key_prefix}{number}",
            source=LabelSource.IMPORTED,
        )
        judgments.append((key, judgment, hit))
    _blank_taken_external_ids(round_, [item for item, _ in new_items.values()])
    Item.objects.bulk_create([item for item, _ in new_items.values()])
    ItemCandidate.objects.bulk_create(
        ItemCandidate(item=item, candidate=cand, position=pos)
        for item, slots in new_items.values()
        for pos, cand in enumerate(slots)
    )
    report.items_created += len(new_items)
    for key, judgment, hit in judgments:
        judgment.item_id = hit[0] if hit is not None else new_items[key][0].pk
    Judgment.objects.bulk_create([j for _, j, _ in judgments])
    report.judgments_created += len(judgments)
