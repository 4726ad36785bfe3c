"""The project's prompt pool: prompts imported to generate rounds from, with a fixed eval split.

One JSONL line:
    {"prompt": "text"} | {"messages": [{"role": "user", "content": "..."}, ...]},
    optional "tags": ["..."] and "id" (kept as the prompt's external id).

Prompts are deduplicated by content hash (`annotation.imports.content_hash`), within the file
and against the project's prompts: a prompt the project already has joins the pool. Whether a
prompt is in the evaluation split is decided once, when it joins the pool, by a hash of its
content (`split_of`), so the split is reproducible and never moves whatever else is imported;
a prompt that was already in the pool keeps its split, and one already used by a round's
items stays in the training split (its answers may be in training data already).

The import is atomic, like every import (`annotation/imports/`): the file is read once to
check every line and list every bad one, and only a clean file is written, in one
transaction.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO

from django.db import transaction
from django.db.models import Count, QuerySet

from annotation.errors import ServiceError
from annotation.imports.formats import (
    content_hash,
    external_id_problem,
    prompt_problems,
    rows_read,
)
from annotation.imports.limits import BATCH, MAX_ERRORS_REPORTED, ImportFailed
from annotation.models import Item, Project, Prompt

DEFAULT_EVAL_FRACTION = 0.1
MAX_TAGS = 32
MAX_TAG_CHARS = 100
FIELDS = {"id", "prompt", "messages", "tags"}

PromptPayload = str | list[dict]


@dataclass
class PoolImportReport:
    """What a pool import did; `train` / `eval` count this file's distinct prompts by split."""

    added: int = 0
    joined_from_rounds: int = 0
    already_in_pool: int = 0
    duplicates_in_file: int = 0
    train: int = 0
    eval: int = 0
    eval_fraction: float = DEFAULT_EVAL_FRACTION
    pool_train: int = 0
    pool_eval: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def split_of(phash: str, *, eval_fraction: float) -> str:
    """Return the split of a prompt by its content hash: eval for a fixed share of hashes.

    The first 32 bits of the sha256 content hash are uniform, so a share `eval_fraction` of
    prompts falls below the cut, the same prompts in every import and on every machine.
    """
    return Prompt.Split.EVAL if int(phash[:8], 16) < eval_fraction * 2**32 else Prompt.Split.TRAIN


def prompt_payload(prompt: Prompt) -> PromptPayload:
    """Return what a model is asked: the chat messages of a chat prompt, else its text."""
    return prompt.messages if prompt.messages else prompt.text


def eval_fraction_check(value) -> float:
    """Return the eval fraction if it is a number in [0, 1); else 400 naming the field."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        error = ServiceError("eval_fraction: give a number from 0 up to (not including) 1.")
        error.field = "eval_fraction"
        raise error
    return float(value)


def pool_row_check(row, *, project: Project) -> list[str]:
    """Return the problems of one parsed pool line (empty when it is good)."""
    if not isinstance(row, dict):
        return ["line must be a JSON object"]
    problems = []
    unknown = set(row) - FIELDS
    if unknown:
        problems.append(
            f"unknown field(s): {', '.join(sorted(unknown))}; "
            "a pool line has 'prompt' or 'messages', and optional 'tags' and 'id'"
        )
    problems += prompt_problems(row, limit=project.max_text_chars)
    tags = row.get("tags", [])
    if not isinstance(tags, list) or not all(
        isinstance(t, str) and t.strip() and len(t) <= MAX_TAG_CHARS for t in tags
    ):
        problems.append(
            f"'tags' must be a list of non-empty strings of at most {MAX_TAG_CHARS} characters"
        )
    elif len(tags) > MAX_TAGS:
        problems.append(f"'tags' has {len(tags)} tags; at most {MAX_TAGS} are allowed")
    id_problem = external_id_problem(row)
    if id_problem:
        problems.append(id_problem)
    return problems


def _clean(row: dict) -> dict:
    payload = row.get("prompt") if row.get("prompt") is not None else row["messages"]
    tags = list(dict.fromkeys(t.strip() for t in row.get("tags", [])))
    return {"payload": payload, "tags": tags, "id": str(row.get("id", ""))}


def _read_file(
    *, project: Project, stream: IO, progress: Callable[[int], None] | None
) -> tuple[dict[str, dict], int]:
    """Return ({content hash: clean row}, duplicates in the file); raise ImportFailed."""
    errors: list[tuple[int, str]] = []
    total_bad = 0
    rows: dict[str, dict] = {}
    ids: dict[str, str] = {}
    duplicates = 0
    for seen, (number, row, parse_error) in enumerate(rows_read(stream, "jsonl"), start=1):
        if progress and seen % 1000 == 0:
            progress(1000)
        problems = [parse_error] if parse_error else pool_row_check(row, project=project)
        if not problems:
            clean = _clean(row)
            phash = content_hash(clean["payload"])
            if clean["id"]:
                first = ids.setdefault(clean["id"], phash)
                if first != phash:
                    problems.append(f"id {clean['id']!r} is given to another prompt earlier")
            if not problems:
                if phash in rows:
                    duplicates += 1
                    merged = rows[phash]["tags"] + clean["tags"]
                    rows[phash]["tags"] = list(dict.fromkeys(merged))
                    rows[phash]["id"] = rows[phash]["id"] or clean["id"]
                else:
                    rows[phash] = clean
        if problems:
            total_bad += 1
            if len(errors) < MAX_ERRORS_REPORTED:
                errors.extend((number, p) for p in problems)
    if total_bad:
        raise ImportFailed(errors, total_bad)
    if not rows:
        raise ImportFailed([(0, "the file holds no prompts")], 1)
    return rows, duplicates


def prompt_pool_import(
    *,
    project: Project,
    stream: IO,
    eval_fraction: float = DEFAULT_EVAL_FRACTION,
    progress: Callable[[int], None] | None = None,
) -> PoolImportReport:
    """Check a whole JSONL file of prompts, then add them to the project's pool atomically.

    Raises ImportFailed listing every bad line (nothing written), or ImportTooLarge at a size
    limit. ``progress(n)`` is called with the number of prompts just handled.
    """
    eval_fraction = eval_fraction_check(eval_fraction)
    rows, duplicates = _read_file(project=project, stream=stream, progress=progress)
    report = PoolImportReport(duplicates_in_file=duplicates, eval_fraction=eval_fraction)
    hashes = list(rows)
    with transaction.atomic():
        # One pool import of a project at a time: two imports of one prompt cannot both add it.
        Project.objects.select_for_update().filter(pk=project.pk).first()
        for start in range(0, len(hashes), BATCH):
            _write_batch(project, {h: rows[h] for h in hashes[start : start + BATCH]}, report)
            if progress:
                progress(min(BATCH, len(hashes) - start))
    counts = prompt_pool_counts(project=project)
    report.pool_train, report.pool_eval = counts["train"], counts["eval"]
    return report


def _write_batch(project: Project, rows: dict[str, dict], report: PoolImportReport) -> None:
    existing = {
        p.content_hash: p
        for p in Prompt.objects.filter(project=project, content_hash__in=list(rows))
    }
    joining = [p for p in existing.values() if not p.in_pool]
    used = set(
        Item.objects.filter(prompt__in=joining).values_list("prompt_id", flat=True).distinct()
    )
    changed, new = [], []
    for phash, row in rows.items():
        prompt = existing.get(phash)
        if prompt is None:
            split = split_of(phash, eval_fraction=report.eval_fraction)
            new.append(
                Prompt(
                    project=project,
                    text=row["payload"] if isinstance(row["payload"], str) else "",
                    messages=None if isinstance(row["payload"], str) else row["payload"],
                    content_hash=phash,
                    external_id=row["id"],
                    in_pool=True,
                    split=split,
                    tags=row["tags"],
                )
            )
            report.added += 1
        else:
            if prompt.in_pool:
                report.already_in_pool += 1
            else:
                prompt.in_pool = True
                prompt.split = (
                    Prompt.Split.TRAIN
                    if prompt.pk in used
                    else split_of(phash, eval_fraction=report.eval_fraction)
                )
                report.joined_from_rounds += 1
            prompt.tags = list(dict.fromkeys([*prompt.tags, *row["tags"]]))
            prompt.external_id = prompt.external_id or row["id"]
            changed.append(prompt)
            split = prompt.split
        if split == Prompt.Split.EVAL:
            report.eval += 1
        else:
            report.train += 1
    Prompt.objects.bulk_create(new)
    Prompt.objects.bulk_update(changed, ["in_pool", "split", "tags", "external_id"])


# --------------------------------------------------------------------------- reads


def prompt_pool_list(*, project: Project, split: str = "", tag: str = "") -> QuerySet[Prompt]:
    """Return the project's pool prompts, newest first, optionally of one split or tag."""
    prompts = Prompt.objects.filter(project=project, in_pool=True)
    if split:
        prompts = prompts.filter(split=split)
    if tag:
        prompts = prompts.filter(tags__contains=[tag])
    return prompts.order_by("-created_at", "-id")


def prompt_pool_counts(*, project: Project) -> dict:
    """Return the pool's size by split, and how many prompts carry each tag (most first)."""
    by_split = dict(
        Prompt.objects.filter(project=project, in_pool=True)
        .values_list("split")
        .annotate(n=Count("id"))
        .values_list("split", "n")
    )
    tags: dict[str, int] = {}
    for row in (
        Prompt.objects.filter(project=project, in_pool=True)
        .exclude(tags=[])
        .values_list("tags", flat=True)
    ):
        for tag in row:
            tags[tag] = tags.get(tag, 0) + 1
    train, eval_ = by_split.get(Prompt.Split.TRAIN, 0), by_split.get(Prompt.Split.EVAL, 0)
    return {
        "total": train + eval_,
        "train": train,
        "eval": eval_,
        "tags": dict(sorted(tags.items(), key=lambda kv: (-kv[1], kv[0]))),
    }


def prompt_pool_draw(
    *, project: Project, n: int, split: str = Prompt.Split.TRAIN, seed: int = 0
) -> list[Prompt]:
    """Return n pool prompts of a split, the least used by rounds' items first.

    Among prompts used equally often the order is a shuffle by `seed`, so rounds drawn with
    different seeds differ and the same seed draws the same prompts again.
    """
    rows = list(
        Prompt.objects.filter(project=project, in_pool=True, split=split)
        .annotate(n_items=Count("items"))
        .values_list("id", "n_items")
    )
    rng = random.Random(seed)
    rng.shuffle(rows)
    rows.sort(key=lambda row: row[1])  # stable: the shuffle orders equally used prompts
    ids = [pk for pk, _ in rows[:n]]
    found = Prompt.objects.in_bulk(ids)
    return [found[pk] for pk in ids]
