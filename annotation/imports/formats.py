"""Reading import files line by line: JSON lines, the items CSV, text normalisation, hashing."""

import csv
import hashlib
import json
import math
import re
from collections.abc import Iterator
from typing import IO

from annotation.imports.limits import bounded_lines

ROLES = {"system", "user", "assistant", "tool"}
_WS = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Return text with outer space stripped and inner runs of white space folded."""
    return _WS.sub(" ", text.strip())


def content_hash(payload) -> str:
    """Return sha256 of normalised text, or of normalised chat messages."""
    if isinstance(payload, str):
        data = normalise(payload)
    else:
        data = json.dumps(
            [[m["role"], normalise(m["content"])] for m in payload], ensure_ascii=False
        )
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def validate_messages(messages, where: str) -> str | None:
    """Return why a chat message list is malformed, or None."""
    if not isinstance(messages, list) or not messages:
        return f"{where} must be a non-empty list of {{role, content}} messages"
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content"} or "content" not in m:
            return f"{where}[{i}] must be an object with 'role' and 'content' only"
        if m.get("role") not in ROLES:
            return f"{where}[{i}].role must be one of {sorted(ROLES)}"
        if not isinstance(m["content"], str):
            return f"{where}[{i}].content must be a string"
    return None


class _NotJson(ValueError):
    pass


def prompt_problems(row: dict, *, limit: int) -> list[str]:
    """Return the problems of a line's prompt: exactly one of 'prompt' (text) or 'messages'
    (chat), not blank, at most ``limit`` characters. Items and the prompt pool both read it."""
    prompt, messages = row.get("prompt"), row.get("messages")
    if (prompt is None) == (messages is None):
        return ["give exactly one of 'prompt' (text) or 'messages' (chat)"]
    if prompt is not None:
        if not isinstance(prompt, str) or not prompt.strip():
            return ["'prompt' must be a non-empty string"]
        if len(prompt) > limit:
            return [f"'prompt' is longer than {limit} characters"]
        return []
    error = validate_messages(messages, "'messages'")
    if error:
        return [error]
    if not any(m["content"].strip() for m in messages):
        return ["'messages' must have some non-blank content"]
    if sum(len(m["content"]) for m in messages) > limit:
        return [f"'messages' are longer than {limit} characters"]
    return []


def external_id_problem(row: dict, key: str = "id") -> str | None:
    """Return what is wrong with a line's external id (a string or integer, 200 characters)."""
    value = row.get(key, "")
    if not isinstance(value, str | int) or isinstance(value, bool) or len(str(value)) > 200:
        return f"'{key}' must be a string or integer of at most 200 characters"
    return None


def _reject_constant(name: str):
    raise _NotJson(f"{name} is not a JSON value")


def unstorable(value) -> str | None:
    """Return why parsed JSON cannot be stored in the database (NUL, lone surrogate, NaN)."""
    stack = [value]
    while stack:  # no recursion: JSON may nest as deep as the parser allows
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                return "text must not contain NUL (\\u0000) characters"
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return "text must not contain unpaired surrogates (\\ud800-\\udfff)"
        elif isinstance(v, float) and not math.isfinite(v):
            return "numbers must be finite"
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def json_line(data: str | bytes) -> tuple[object | None, str | None]:
    """Parse one line of JSON; return (value, None) or (None, why it cannot be imported)."""
    try:
        value = json.loads(data, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        return None, f"bad JSON: {exc.msg} at column {exc.colno}"
    except UnicodeDecodeError:
        return None, "bad JSON: not UTF-8"
    except RecursionError:
        return None, "bad JSON: nested too deeply"
    except _NotJson as exc:
        return None, f"bad JSON: {exc}"
    except ValueError:  # an integer literal longer than Python converts
        return None, "bad JSON: a number has too many digits"
    problem = unstorable(value)
    return (None, problem) if problem else (value, None)


def parse_jsonl(stream: IO) -> Iterator[tuple[int, object | None, str | None]]:
    """Yield (line number, value, problem) for each non-blank JSON line."""
    for number, raw in bounded_lines(stream):
        line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if not line.strip():
            continue
        yield number, *json_line(line)


def _csv_text(stream: IO) -> Iterator[str]:
    """Yield the stream's text lines (UTF-8, universal newlines), each bounded in size."""
    for _, raw in bounded_lines(stream):
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        *lines, rest = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        yield from (line + "\n" for line in lines)
        if rest:
            yield rest


def parse_csv(stream: IO) -> Iterator[tuple[int, object | None, str | None]]:
    """CSV columns: id, prompt, candidate_1..candidate_K, model_1..model_K, gold (optional)."""
    reader = csv.DictReader(_csv_text(stream))
    number = 1
    try:
        for number, rec in enumerate(reader, start=2):
            k = sum(1 for key in rec if key and key.startswith("candidate_"))
            row: dict = {"prompt": rec.get("prompt"), "candidates": []}
            if rec.get("id"):
                row["id"] = rec["id"]
            for i in range(1, k + 1):
                cand = {"text": rec.get(f"candidate_{i}")}
                if rec.get(f"model_{i}"):
                    cand["model_name"] = rec[f"model_{i}"]
                row["candidates"].append(cand)
            problem = None
            if rec.get("gold"):
                gold = rec["gold"]
                row["gold"], problem = json_line(gold) if gold.startswith("[") else (gold, None)
            problem = problem or unstorable(row)
            yield (number, None, problem) if problem else (number, row, None)
    except (UnicodeDecodeError, csv.Error) as exc:
        reason = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)
        yield number + 1, None, f"cannot read the CSV: {reason}"


def rows_read(stream: IO, fmt: str):
    """Read the stream from its start as JSONL or CSV rows."""
    stream.seek(0)
    return parse_csv(stream) if fmt == "csv" else parse_jsonl(stream)
