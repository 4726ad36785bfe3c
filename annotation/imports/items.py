"""Import prompts with K candidates (JSONL or CSV) into a round: validated whole, then atomic.

One JSONL line:
    {"id": "q1", "prompt": "text" | "messages": [{"role": "user", "content": "..."}],
     "candidates": [{"text": "...", "model_name": "...", "checkpoint_id": "...",
                     "generation_config": {"temperature": 0.7, "top_p": 0.9, ...}}, ...],
     "gold": "A" | [1, 2, 3]}            # optional; marks a hidden gold item
The file is read twice, streaming (`annotation.imports.limits.bounded_lines`): a first pass
validates every line and reports every bad one; only a clean file is written, inside one
transaction, in batches.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from django.db import transaction

from annotation.dedup import DedupTracker
from annotation.imports.formats import (
    content_hash,
    external_id_problem,
    normalise,
    prompt_problems,
    rows_read,
)
from annotation.imports.limits import BATCH, MAX_ERRORS_REPORTED, ImportFailed
from annotation.models import (
    Candidate,
    Choice,
    Item,
    ItemCandidate,
    Project,
    Prompt,
    Round,
    TaskKind,
)
from annotation.rounds import round_create

GENERATION_KEYS = {
    "batch",  # [start, size, row] of a batched generate() call: needed to reproduce a sample
    "template",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_new_tokens",
    "stop",
    "seed",
    "system_prompt",
    "tools",
    "k",
    "repetition_penalty",
    "do_sample",
    # training.generation backends: which one, and for a server the exact request and reply
    "backend",
    "endpoint",
    "request",
    "response",
}


@dataclass
class ImportReport:
    items_created: int = 0
    prompts_created: int = 0
    prompts_reused: int = 0
    candidates_created: int = 0
    candidates_reused: int = 0
    duplicate_prompts_in_file: int = 0
    duplicate_pairs_in_file: int = 0
    dedup: dict = field(default_factory=dict)
    round_id: int | None = None
    notes: list[str] = field(default_factory=list)


def _candidate_problems(cands: list, *, limit: int) -> tuple[list[dict], list[str]]:
    """Return (candidates as dicts, problems) for a row's candidate list."""
    problems: list[str] = []
    clean_cands = []
    for i, c in enumerate(cands):
        if isinstance(c, str):
            c = {"text": c}
        if not isinstance(c, dict):
            problems.append(f"candidates[{i}] must be an object or a string")
            continue
        extra = set(c) - {"text", "model_name", "checkpoint_id", "generation_config"}
        if extra:
            problems.append(f"candidates[{i}] has unknown field(s): {', '.join(sorted(extra))}")
        text = c.get("text")
        if not isinstance(text, str) or not text.strip():
            problems.append(f"candidates[{i}].text must be a non-empty string")
        elif len(text) > limit:
            problems.append(f"candidates[{i}].text is longer than {limit} characters")
        for key in ("model_name", "checkpoint_id"):
            if not isinstance(c.get(key, ""), str) or len(c.get(key, "")) > 200:
                problems.append(f"candidates[{i}].{key} must be a string (≤ 200 characters)")
        gen = c.get("generation_config", {})
        if not isinstance(gen, dict):
            problems.append(f"candidates[{i}].generation_config must be an object")
        else:
            bad = set(gen) - GENERATION_KEYS
            if bad:
                keys = ", ".join(sorted(bad))
                problems.append(f"candidates[{i}].generation_config has unknown key(s): {keys}")
        clean_cands.append(c)
    return clean_cands, problems


def validate_row(row, *, project: Project) -> tuple[dict | None, list[str]]:
    """Check one parsed row; return (clean row, problems)."""
    problems: list[str] = []
    if not isinstance(row, dict):
        return None, ["line must be a JSON object"]
    unknown = set(row) - {"id", "prompt", "messages", "candidates", "gold", "group_key"}
    if unknown:
        problems.append(f"unknown field(s): {', '.join(sorted(unknown))}")
    problems += prompt_problems(row, limit=project.max_text_chars)
    id_problem = external_id_problem(row)
    if id_problem:
        problems.append(id_problem)
    group_key = row.get("group_key", "")
    if (
        not isinstance(group_key, str | int)
        or isinstance(group_key, bool)
        or len(str(group_key)) > 200
    ):
        problems.append("'group_key' must be a string of at most 200 characters")
    cands = row.get("candidates")
    if not isinstance(cands, list):
        problems.append("'candidates' must be a list")
        cands = []
    elif len(cands) != project.k:
        problems.append(f"expected {project.k} candidates, got {len(cands)}")
    clean_cands, candidate_problems = _candidate_problems(cands, limit=project.max_text_chars)
    problems.extend(candidate_problems)
    texts = [c.get("text") for c in clean_cands if isinstance(c.get("text"), str)]
    if len({normalise(t) for t in texts}) < len(texts):
        problems.append("two candidates of one item have the same text")
    gold = row.get("gold")
    if gold is not None:
        if project.task_kind == TaskKind.PAIRWISE:
            if gold not in Choice.values:
                problems.append(f"'gold' must be one of {Choice.values}")
        elif not (
            isinstance(gold, list)
            and len(gold) == project.k
            and all(isinstance(r, int) and 1 <= r <= project.k for r in gold)
        ):
            problems.append(f"'gold' must list {project.k} ranks from 1 to {project.k}")
    if problems:
        return None, problems
    return {**row, "candidates": clean_cands, "id": str(row.get("id", ""))}, []


def _check_file(
    *, project: Project, stream: IO, fmt: str, round_: Round | None, progress
) -> ImportReport:
    """Read the whole file once; raise ImportFailed listing every bad line, else report it."""
    errors: list[tuple[int, str]] = []
    total_bad = 0
    seen_ids: set[str] = set()
    tracker = DedupTracker()
    seen_pairs: set[frozenset] = set()
    report = ImportReport()
    n_rows = 0
    for seen, (number, row, parse_error) in enumerate(rows_read(stream, fmt), start=1):
        if progress and seen % 1000 == 0:
            progress(1000)
        problems = [parse_error] if parse_error else validate_row(row, project=project)[1]
        if not problems:
            n_rows += 1
            if row.get("id") not in (None, ""):
                key = str(row["id"])
                if key in seen_ids:
                    problems.append(f"duplicate id {key!r} in file")
                seen_ids.add(key)
            payload = row.get("prompt") or row.get("messages")
            phash = content_hash(payload)
            if tracker.see_prompt(phash, payload, f"line {number}"):
                report.duplicate_prompts_in_file += 1
            texts = [c["text"] if isinstance(c, dict) else c for c in row["candidates"]]
            for text in texts:
                tracker.see_response(phash, content_hash(text), text, f"line {number}")
            pair = frozenset(content_hash(text) for text in texts)
            if (phash, pair) in seen_pairs:
                problems.append("the same prompt with the same candidates appears earlier")
            seen_pairs.add((phash, pair))
        if problems:
            total_bad += 1
            if len(errors) < MAX_ERRORS_REPORTED:
                errors.extend((number, p) for p in problems)
    if round_ is not None and seen_ids:
        clash = set(
            Item.objects.filter(round=round_, external_id__in=list(seen_ids)[:10000]).values_list(
                "external_id", flat=True
            )
        )
        for ext in sorted(clash):
            errors.append((0, f"id {ext!r} is already in round {round_.number}"))
            total_bad += 1
    if total_bad:
        raise ImportFailed(errors, total_bad)
    report.dedup = tracker.report()
    del tracker, seen_pairs
    if n_rows == 0:
        raise ImportFailed([(0, "the file holds no rows")], 1)
    return report


def items_import(
    *,
    project: Project,
    stream: IO,
    fmt: str = "jsonl",
    round_: Round | None = None,
    progress: Callable[[int], None] | None = None,
) -> ImportReport:
    """Validate a whole file, then create its prompts, candidates and items atomically.

    ``progress(n)`` is called with the number of rows just handled, in both passes.
    """
    report = _check_file(project=project, stream=stream, fmt=fmt, round_=round_, progress=progress)
    with transaction.atomic():
        round_ = round_ or round_create(project=project)
        report.round_id = round_.pk
        batch: list[dict] = []
        for _, row, _ in rows_read(stream, fmt):
            batch.append(validate_row(row, project=project)[0])
            if len(batch) >= BATCH:
                _write_batch(project, round_, batch, report)
                if progress:
                    progress(len(batch))
                batch = []
        if batch:
            _write_batch(project, round_, batch, report)
            if progress:
                progress(len(batch))
    return report


def prompts_get_or_create(*, project: Project, rows: dict[str, dict]) -> tuple[dict, int]:
    """Return ({content hash: Prompt}, number created) for rows keyed by prompt hash.

    A row gives 'prompt' (text) or 'messages', and optionally 'group_key' and 'id'.
    """
    existing = set(
        Prompt.objects.filter(project=project, content_hash__in=list(rows)).values_list(
            "content_hash", flat=True
        )
    )
    new_prompts = [
        Prompt(
            project=project,
            text=row.get("prompt") or "",
            messages=row.get("messages"),
            content_hash=h,
            group_key=str(row.get("group_key") or ""),
            external_id=str(row.get("id") or ""),
        )
        for h, row in rows.items()
        if h not in existing
    ]
    Prompt.objects.bulk_create(new_prompts)
    prompts = {
        p.content_hash: p
        for p in Prompt.objects.filter(project=project, content_hash__in=list(rows))
    }
    return prompts, len(new_prompts)


def candidates_get_or_create(*, keys: list[tuple[int, str, str, dict]]) -> tuple[dict, int, int]:
    """Return ({(prompt id, hash, model): Candidate}, created, reused) for candidate keys.

    Each key is (prompt id, content hash, model name, candidate dict with 'text' and
    optional 'checkpoint_id' / 'generation_config').
    """
    found = {
        (c.prompt_id, c.content_hash, c.model_name): c
        for c in Candidate.objects.filter(
            prompt_id__in={k[0] for k in keys}, content_hash__in={k[1] for k in keys}
        )
    }
    new_c: dict = {}
    reused = 0
    for pid, h, model, c in keys:
        key = (pid, h, model)
        if key in found or key in new_c:
            reused += 1
            continue
        new_c[key] = Candidate(
            prompt_id=pid,
            text=c["text"],
            content_hash=h,
            model_name=model,
            checkpoint_id=c.get("checkpoint_id", ""),
            generation_config=c.get("generation_config", {}),
        )
    Candidate.objects.bulk_create(new_c.values())
    found.update(new_c)
    return found, len(new_c), reused


def _write_batch(project: Project, round_: Round, rows: list[dict], report: ImportReport) -> None:
    hashes = {content_hash(row.get("prompt") or row.get("messages")): row for row in rows}
    prompts, created = prompts_get_or_create(project=project, rows=hashes)
    report.prompts_reused += len(rows) - created
    report.prompts_created += created
    cand_keys = []
    for row in rows:
        prompt = prompts[content_hash(row.get("prompt") or row.get("messages"))]
        for c in row["candidates"]:
            cand_keys.append((prompt.pk, content_hash(c["text"]), c.get("model_name", ""), c))
    existing_c, created_c, reused_c = candidates_get_or_create(keys=cand_keys)
    report.candidates_created += created_c
    report.candidates_reused += reused_c
    items, slots = [], []
    for row in rows:
        prompt = prompts[content_hash(row.get("prompt") or row.get("messages"))]
        gold = row.get("gold")
        item = Item(
            project=project,
            round=round_,
            prompt=prompt,
            is_gold=gold is not None,
            gold_answer=gold,
            external_id=row.get("id", ""),
        )
        items.append(item)
        slots.append(
            [
                existing_c[(prompt.pk, content_hash(c["text"]), c.get("model_name", ""))]
                for c in row["candidates"]
            ]
        )
    Item.objects.bulk_create(items)
    ItemCandidate.objects.bulk_create(
        ItemCandidate(item=item, candidate=cand, position=pos)
        for item, cands in zip(items, slots, strict=True)
        for pos, cand in enumerate(cands)
    )
    report.items_created += len(items)
