"""Import existing preference data as items plus `imported` judgments: validated, then atomic.

Formats, one JSON object per line (``.jsonl``; gzip is the caller's business):

* ``hh`` — Anthropic HH-RLHF: ``{"chosen": "\\n\\nHuman: ...\\n\\nAssistant: ...",
  "rejected": "..."}``. Both dialogues share everything up to their last common
  ``"\\n\\nAssistant:"``; that prefix becomes the chat prompt (Human -> user, Assistant ->
  assistant, any text before the first turn -> system) and what follows in each dialogue is
  a candidate (one leading space dropped), so rendering the prompt and the answer back gives
  the original dialogue character for character.
* ``trl`` — TRL preference rows ``{"prompt", "chosen", "rejected"}``, plain text or
  conversational (lists of ``{"role", "content"}``); a conversational ``chosen`` may repeat
  the prompt before its single assistant answer (UltraFeedback style). Without ``prompt``,
  text rows are read as HH dialogues and message rows split at their common prefix.
* ``ranking`` — ``{"prompt" | "messages", "candidates": [text | {"text", "model_name",
  "checkpoint_id", "generation_config"}], "ranking": [rank of candidate i, 1 = best]}``.

Optional on every line: ``id``, ``rater`` (who labelled; default ``import:<batch>``),
``strength`` (slightly/much), ``confidence`` (1-5), ``group_key`` (split group), and for
pairwise formats ``chosen_model`` / ``rejected_model``. Other fields are ignored and listed
in the report.

A pair's two answers sit in a canonical order fixed by their content hashes (so labels are
balanced between A and B and the same pair always gets the same order); a ranking keeps the
file's order. The same prompt with the same answers (in either order) becomes one item in
the round, and each line's label a judgment on it: duplicates are counted, never dropped
silently. Each judgment's ``idempotency_key`` is ``import:<batch>:<line>``; importing a
batch twice is refused.

Two streaming passes, bounded like `annotation.importers.bounded_lines`: the first validates
every line (and hashes the file for the default batch name), the second writes in batches
inside one transaction.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO

from django.db import transaction

from annotation.dedup import DedupTracker, MinHasher, key64, pair_key
from annotation.importers import (
    BATCH,
    MAX_ERRORS_REPORTED,
    ImportFailed,
    _validate_messages,
    bounded_lines,
    candidates_get_or_create,
    content_hash,
    json_line,
    normalise,
    prompts_get_or_create,
)
from annotation.models import (
    Item,
    ItemCandidate,
    Judgment,
    LabelSource,
    Project,
    Round,
    TaskKind,
)

FORMATS = ("hh", "trl", "ranking")
HUMAN, ASSISTANT = "\n\nHuman: ", "\n\nAssistant: "
_TURN = re.compile(r"\n\n(Human|Assistant): ")
_ASSISTANT_MARK = "\n\nAssistant:"
_BATCH_NAME = re.compile(r"^[\w.\-]{1,60}$")
COMMON_FIELDS = {"id", "rater", "strength", "confidence", "group_key"}
PAIR_FIELDS = {"prompt", "chosen", "rejected", "chosen_model", "rejected_model"}
RANKING_FIELDS = {"prompt", "messages", "candidates", "ranking"}


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


# ---- parsing: one line -> one record, or problems ---------------------------------------


def split_hh_dialogue(text: str) -> list[dict]:
    """Split an HH-RLHF dialogue into chat messages; `render_hh` gives the text back exactly."""
    parts = _TURN.split(text)
    messages = [{"role": "system", "content": parts[0]}] if parts[0] else []
    for role, content in zip(parts[1::2], parts[2::2], strict=True):
        messages.append({"role": "user" if role == "Human" else "assistant", "content": content})
    return messages


def render_hh(messages: list[dict] | str, answer: str | None = None) -> str:
    """Render chat messages (and a final assistant answer) as an HH-RLHF dialogue."""
    if isinstance(messages, str):
        out = HUMAN + messages
    else:
        marks = {"user": HUMAN, "assistant": ASSISTANT}
        out = "".join(marks.get(m["role"], "") + m["content"] for m in messages)
    return out if answer is None else out + ASSISTANT + answer


def split_hh_pair(chosen: str, rejected: str) -> tuple[list[dict], str, str] | str:
    """Return (prompt messages, chosen answer, rejected answer), or a problem message.

    The prompt ends at the last ``"\\n\\nAssistant:"`` inside the dialogues' common prefix.
    """
    limit = 0
    for a, b in zip(chosen, rejected, strict=False):
        if a != b:
            break
        limit += 1
    cut = chosen.rfind(_ASSISTANT_MARK, 0, limit)
    if cut < 0:
        return "chosen and rejected share no prefix ending in '\\n\\nAssistant:'"
    prefix = chosen[:cut]
    if not prefix.startswith(HUMAN):
        return "dialogue must start with '\\n\\nHuman: '"
    answers = []
    for side, text in (("chosen", chosen), ("rejected", rejected)):
        rest = text[cut + len(_ASSISTANT_MARK) :]
        if not rest.startswith(" "):
            return f"{side}: the final 'Assistant:' must be followed by a space"
        if not rest.strip():
            return f"{side}: the final assistant answer is empty"
        answers.append(rest[1:])
    return split_hh_dialogue(prefix), answers[0], answers[1]


def _single_answer(value, prompt_messages: list[dict], side: str) -> tuple[str | None, str | None]:
    """Return (answer text, problem) from a conversational completion."""
    error = _validate_messages(value, f"'{side}'")
    if error:
        return None, error
    if len(value) > len(prompt_messages) and value[: len(prompt_messages)] == prompt_messages:
        value = value[len(prompt_messages) :]
    if len(value) != 1 or value[0]["role"] != "assistant":
        return None, f"'{side}' must be one assistant message (optionally after the prompt)"
    return value[0]["content"], None


def _parse_pair(row: dict, fmt: str) -> tuple[dict | None, list[str]]:
    chosen, rejected = row.get("chosen"), row.get("rejected")
    prompt = row.get("prompt")
    out: dict = {}
    if fmt == "hh" or (prompt is None and isinstance(chosen, str)):
        if fmt == "hh" and prompt is not None:
            return None, ["HH-RLHF rows have no 'prompt'; use format 'trl'"]
        if not isinstance(chosen, str) or not isinstance(rejected, str):
            return None, ["'chosen' and 'rejected' must be dialogue strings"]
        split = split_hh_pair(chosen, rejected)
        if isinstance(split, str):
            return None, [split]
        out["messages"], a, b = split
    elif prompt is None:
        if not isinstance(chosen, list) or not isinstance(rejected, list):
            return None, ["'chosen' and 'rejected' must both be message lists"]
        for side, value in (("chosen", chosen), ("rejected", rejected)):
            error = _validate_messages(value, f"'{side}'")
            if error:
                return None, [error]
        if chosen[:-1] != rejected[:-1] or len(chosen) < 2:
            return None, ["without 'prompt', chosen and rejected must differ in the last turn"]
        out["messages"] = chosen[:-1]
        a, b = chosen[-1], rejected[-1]
        if a["role"] != "assistant" or b["role"] != "assistant":
            return None, ["the last turn of chosen and rejected must be the assistant's"]
        a, b = a["content"], b["content"]
    elif isinstance(prompt, str):
        if not prompt.strip():
            return None, ["'prompt' must be a non-empty string"]
        if not isinstance(chosen, str) or not isinstance(rejected, str):
            return None, ["a text 'prompt' needs text 'chosen' and 'rejected'"]
        out["prompt"], a, b = prompt, chosen, rejected
    else:
        error = _validate_messages(prompt, "'prompt'")
        if error:
            return None, [error]
        out["messages"] = prompt
        a, problem_a = _single_answer(chosen, prompt, "chosen")
        b, problem_b = _single_answer(rejected, prompt, "rejected")
        problems = [p for p in (problem_a, problem_b) if p]
        if problems:
            return None, problems
    problems = []
    for side, text in (("chosen", a), ("rejected", b)):
        if not isinstance(text, str) or not text.strip():
            problems.append(f"'{side}' answer must be a non-empty string")
    if problems:
        return None, problems
    models = []
    for key in ("chosen_model", "rejected_model"):
        value = row.get(key, "")
        if not isinstance(value, str) or len(value) > 200:
            problems.append(f"'{key}' must be a string of at most 200 characters")
        models.append(value if isinstance(value, str) else "")
    out["candidates"] = [
        {"text": a, "model_name": models[0]},
        {"text": b, "model_name": models[1]},
    ]
    out["winner"] = 0
    return out, problems


def _parse_ranking(row: dict, project: Project) -> tuple[dict | None, list[str]]:
    problems: list[str] = []
    prompt, messages = row.get("prompt"), row.get("messages")
    out: dict = {}
    if (prompt is None) == (messages is None):
        return None, ["give exactly one of 'prompt' (text) or 'messages' (chat)"]
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt.strip():
            return None, ["'prompt' must be a non-empty string"]
        out["prompt"] = prompt
    else:
        error = _validate_messages(messages, "'messages'")
        if error:
            return None, [error]
        out["messages"] = messages
    cands = row.get("candidates")
    if not isinstance(cands, list) or len(cands) != project.k:
        return None, [f"'candidates' must be a list of {project.k} answers"]
    clean = []
    for i, c in enumerate(cands):
        c = {"text": c} if isinstance(c, str) else c
        if not isinstance(c, dict) or not isinstance(c.get("text"), str) or not c["text"].strip():
            problems.append(f"candidates[{i}] must be a non-empty string or have a 'text'")
            continue
        extra = set(c) - {"text", "model_name", "checkpoint_id", "generation_config"}
        if extra:
            problems.append(f"candidates[{i}] has unknown field(s): {', '.join(sorted(extra))}")
        for key in ("model_name", "checkpoint_id"):
            if not isinstance(c.get(key, ""), str) or len(c.get(key, "")) > 200:
                problems.append(f"candidates[{i}].{key} must be a string (≤ 200 characters)")
        if not isinstance(c.get("generation_config", {}), dict):
            problems.append(f"candidates[{i}].generation_config must be an object")
        clean.append(c)
    ranking = row.get("ranking")
    if not (
        isinstance(ranking, list)
        and len(ranking) == project.k
        and all(isinstance(r, int) and not isinstance(r, bool) for r in ranking)
        and all(1 <= r <= project.k for r in ranking)
    ):
        problems.append(f"'ranking' must list {project.k} ranks from 1 to {project.k}")
    elif min(ranking) != 1:
        problems.append("'ranking' must give rank 1 to the best answer")
    out["candidates"] = clean
    out["ranking"] = ranking
    return (None if problems else out), problems


def parse_line(row, *, fmt: str, project: Project) -> tuple[dict | None, list[str], set]:
    """Check one parsed line; return (record, problems, ignored field names).

    A record has 'prompt' or 'messages', 'candidates' (dicts with 'text'), and either
    'winner' (index of the preferred candidate) or 'ranking', plus the common fields.
    """
    if not isinstance(row, dict):
        return None, ["line must be a JSON object"], set()
    known = COMMON_FIELDS | (RANKING_FIELDS if fmt == "ranking" else PAIR_FIELDS)
    ignored = set(row) - known
    if fmt == "ranking":
        record, problems = _parse_ranking(row, project)
    else:
        if not {"chosen", "rejected"} <= set(row):
            return None, ["'chosen' and 'rejected' are required"], ignored
        record, problems = _parse_pair(row, fmt)
    if record is None:
        return None, problems, ignored
    limit = project.max_text_chars
    payload = record.get("prompt") or record.get("messages")
    size = len(payload) if isinstance(payload, str) else sum(len(m["content"]) for m in payload)
    if size > limit:
        problems.append(f"the prompt is longer than {limit} characters")
    texts = [c["text"] for c in record["candidates"]]
    if any(len(t) > limit for t in texts):
        problems.append(f"an answer is longer than {limit} characters")
    if len({normalise(t) for t in texts}) < len(texts):
        problems.append("two answers have the same text")
    ext_id = row.get("id", "")
    if not isinstance(ext_id, str | int) or isinstance(ext_id, bool) or len(str(ext_id)) > 200:
        problems.append("'id' must be a string or integer of at most 200 characters")
    rater = row.get("rater", "")
    if not isinstance(rater, str | int) or isinstance(rater, bool) or len(str(rater)) > 200:
        problems.append("'rater' must be a string of at most 200 characters")
    strength = row.get("strength", "")
    if strength not in ("", None, *Judgment.Strength.values):
        problems.append(f"'strength' must be one of {Judgment.Strength.values}")
    confidence = row.get("confidence")
    if confidence is not None and (
        not isinstance(confidence, int) or isinstance(confidence, bool) or not 1 <= confidence <= 5
    ):
        problems.append("'confidence' must be an integer from 1 to 5")
    group_key = row.get("group_key", "")
    if not isinstance(group_key, str | int) or len(str(group_key)) > 200:
        problems.append("'group_key' must be a string of at most 200 characters")
    if problems:
        return None, problems, ignored
    record.update(
        id=str(ext_id),
        rater=str(rater),
        strength=strength or "",
        confidence=confidence,
        group_key=str(group_key or ""),
    )
    return record, [], ignored


def _canonical(record: dict) -> tuple[list[dict], list[str], str | None, list[int] | None]:
    """Return (candidates in canonical order, their hashes, choice, ranking)."""
    cands = record["candidates"]
    hashes = [content_hash(c["text"]) for c in cands]
    if "winner" not in record:
        return cands, hashes, None, record["ranking"]
    order = sorted(range(2), key=lambda i: hashes[i])
    choice = "A" if order[0] == record["winner"] else "B"
    return [cands[i] for i in order], [hashes[i] for i in order], choice, None


def _lines(stream: IO) -> Iterator[tuple[int, object | None, str | None, bytes]]:
    """Yield (line number, parsed JSON or None, parse error, raw bytes) for non-blank lines."""
    stream.seek(0)
    for number, raw in bounded_lines(stream):
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8")
        if not data.strip():
            continue
        yield number, *json_line(data), data


# ---- the service --------------------------------------------------------------------------


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
    if batch and not _BATCH_NAME.match(batch):
        raise ImportFailed([(0, "batch must be 1-60 letters, digits, '.', '-' or '_'")], 1)

    # Pass 1: validate every line, hash the file, count duplicates.
    report = PreferenceImportReport()
    errors: list[tuple[int, str]] = []
    total_bad = 0
    file_hash = hashlib.sha256()
    tracker = DedupTracker(near_duplicates=MinHasher() if near_duplicates else None)
    ignored: Counter = Counter()
    labels: Counter = Counter()
    seen_ids: set[str] = set()
    for number, row, parse_error, raw in _lines(stream):
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
            cands, hashes, choice, _ = _canonical(record)
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

    from annotation.errors import Conflict
    from annotation.services import round_close, round_create

    key_prefix = f"import:{report.batch}:"
    if Judgment.objects.filter(project=project, idempotency_key__startswith=key_prefix).exists():
        raise Conflict(f"batch {report.batch!r} was already imported.", code="already_imported")

    # Pass 2: write in batches, in one transaction.
    with transaction.atomic():
        target = round_ or round_create(project=project, source_key=f"import:{report.batch}")
        report.round_id, report.round_number = target.pk, target.number
        chunk: list[tuple[int, dict]] = []
        for number, row, _, _ in _lines(stream):
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
        canon.append((number, record, phash, *_canonical(record)))
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
            choice = "A" if ranking[0] < ranking[1] else "B" if ranking[0] > ranking[1] else "tie"
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
    # Items sharing an external id with an earlier item of the round keep their id blank.
    ext_ids = [item.external_id for item, _ in new_items.values() if item.external_id]
    taken = set(
        Item.objects.filter(round=round_, external_id__in=ext_ids).values_list(
            "external_id", flat=True
        )
    )
    seen_ext: set[str] = set()
    for item, _ in new_items.values():
        if item.external_id in taken or item.external_id in seen_ext:
            item.external_id = ""
        seen_ext.add(item.external_id)
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
