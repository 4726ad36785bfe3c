"""Read lines of existing preference data (HH-RLHF, TRL rows, rankings) into checked records.

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
file's order.
"""

import re
from collections.abc import Iterator
from typing import IO

from annotation.imports.formats import content_hash, json_line, normalise, validate_messages
from annotation.imports.limits import bounded_lines
from annotation.models import Judgment, Project

FORMATS = ("hh", "trl", "ranking")
HUMAN, ASSISTANT = "\n\nHuman: ", "\n\nAssistant: "
_TURN = re.compile(r"\n\n(Human|Assistant): ")
_ASSISTANT_MARK = "\n\nAssistant:"
BATCH_NAME = re.compile(r"^[\w.\-]{1,60}$")
COMMON_FIELDS = {"id", "rater", "strength", "confidence", "group_key"}
PAIR_FIELDS = {"prompt", "chosen", "rejected", "chosen_model", "rejected_model"}
RANKING_FIELDS = {"prompt", "messages", "candidates", "ranking"}


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
    error = validate_messages(value, f"'{side}'")
    if error:
        return None, error
    if len(value) > len(prompt_messages) and value[: len(prompt_messages)] == prompt_messages:
        value = value[len(prompt_messages) :]
    if len(value) != 1 or value[0]["role"] != "assistant":
        return None, f"'{side}' must be one assistant message (optionally after the prompt)"
    return value[0]["content"], None


def parse_pair(row: dict, fmt: str) -> tuple[dict | None, list[str]]:
    """Check a chosen/rejected row; return (record with the chosen answer first, problems)."""
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
            error = validate_messages(value, f"'{side}'")
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
        error = validate_messages(prompt, "'prompt'")
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
        error = validate_messages(messages, "'messages'")
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
        record, problems = parse_pair(row, fmt)
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


def canonical(record: dict) -> tuple[list[dict], list[str], str | None, list[int] | None]:
    """Return (candidates in canonical order, their hashes, choice, ranking)."""
    cands = record["candidates"]
    hashes = [content_hash(c["text"]) for c in cands]
    if "winner" not in record:
        return cands, hashes, None, record["ranking"]
    order = sorted(range(2), key=lambda i: hashes[i])
    choice = "A" if order[0] == record["winner"] else "B"
    return [cands[i] for i in order], [hashes[i] for i in order], choice, None


def lines_read(stream: IO) -> Iterator[tuple[int, object | None, str | None, bytes]]:
    """Yield (line number, parsed JSON or None, parse error, raw bytes) for non-blank lines."""
    stream.seek(0)
    for number, raw in bounded_lines(stream):
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8")
        if not data.strip():
            continue
        yield number, *json_line(data), data
