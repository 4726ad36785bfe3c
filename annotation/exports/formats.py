"""Render decisions as rows of the export formats (trl, hh, unpaired, raw)."""

from __future__ import annotations

import json

from annotation.exports.decisions import Decision
from annotation.exports.policy import ExportPolicy, pseudonym
from annotation.exports.select import PromptGroup, Unit, Vote
from annotation.imports import render_hh


class Renderer:
    """Build output rows for one prompt in the export's format."""

    def __init__(self, policy: ExportPolicy, conversational: bool, project_id: int):
        self.policy = policy
        self.conversational = conversational
        self.project_id = project_id

    def prompt(self, payload):
        if self.conversational:
            return [{"role": "user", "content": payload}] if isinstance(payload, str) else payload
        if isinstance(payload, str):
            return payload
        return render_hh(payload) + "\n\nAssistant:"

    def answer(self, text: str):
        if self.conversational:
            return [{"role": "assistant", "content": text}]
        return text

    def plain_answer(self, payload, text: str) -> str:
        # An HH-style prompt ends in "Assistant:"; its answer starts after one space.
        return text if isinstance(payload, str) else " " + text

    def completion(self, payload, text: str):
        return self.answer(text) if self.conversational else self.plain_answer(payload, text)

    def preference(self, payload, unit: Unit, d: Decision) -> dict:
        chosen, rejected = unit.answers[d.first][0], unit.answers[d.second][0]
        if self.policy.format == "hh":
            return {"chosen": render_hh(payload, chosen), "rejected": render_hh(payload, rejected)}
        row = {
            "prompt": self.prompt(payload),
            "chosen": self.completion(payload, chosen),
            "rejected": self.completion(payload, rejected),
            "margin": d.margin,
            "soft_label": d.soft_label,
            "group_id": d.group_id,
        }
        if self.policy.ties == "keep":
            row["tie"] = d.label == "tie"
        return row

    def encoded_answers(self, payload, unit: Unit) -> list[str]:
        """Return each answer of a unit JSON-encoded as it appears in a preference row."""
        if self.policy.format == "hh":
            return [encode(render_hh(payload, a[0])) for a in unit.answers]
        return [encode(self.completion(payload, a[0])) for a in unit.answers]

    def preference_line(self, prompt_json: str, answers: list[str], d: Decision) -> str:
        """Return the JSON line of `preference` from pre-encoded parts (the hot path)."""
        if self.policy.format == "hh":
            return f'{{"chosen":{answers[d.first]},"rejected":{answers[d.second]}}}'
        line = (
            f'{{"prompt":{prompt_json},"chosen":{answers[d.first]},'
            f'"rejected":{answers[d.second]},"margin":{_number(d.margin)},'
            f'"soft_label":{_number(d.soft_label)},"group_id":{encode(d.group_id)}'
        )
        if self.policy.ties == "keep":
            line += ',"tie":true}' if d.label == "tie" else ',"tie":false}'
        else:
            line += "}"
        return line

    def unpaired(self, payload, text: str, label: bool, gid: str) -> dict:
        return {
            "prompt": self.prompt(payload),
            "completion": self.completion(payload, text),
            "label": label,
            "group_id": gid,
        }

    def both_bad(self, payload, unit: Unit, d: Decision) -> dict:
        answers = [unit.answers[d.first][0], unit.answers[d.second][0]]
        return {
            "prompt": self.prompt(payload),
            "responses": [self.completion(payload, a) for a in answers],
            "group_id": d.group_id,
        }

    def raw(self, group: PromptGroup, unit: Unit, vote: Vote) -> dict:
        confidence, time_ms, shown, rationale, is_gold, is_repeat, qc_flag, order = vote.raw
        return {
            "judgment_id": vote.judgment_id,
            "item_id": unit.item_ids[0],
            "round": min(unit.rounds),
            "group_id": unit.gid,
            "prompt": group.payload if isinstance(group.payload, str) else None,
            "messages": None if isinstance(group.payload, str) else group.payload,
            "responses": [a[0] for a in unit.answers],
            "models": [a[2] for a in unit.answers],
            "annotator": pseudonym(self.project_id, *_rater_parts(vote.rater)),
            "source": vote.source,
            "choice": vote.label if isinstance(vote.label, str) else None,
            "ranking": vote.label if isinstance(vote.label, list) else None,
            "shown_choice": shown,
            "display_order": order,
            "strength": vote.strength,
            "confidence": confidence,
            "time_spent_ms": time_ms,
            "rationale": rationale,
            "is_gold": is_gold,
            "is_repeat": is_repeat,
            "qc_flag": qc_flag,
        }


def _rater_parts(rater: tuple) -> tuple[int | None, str]:
    return (rater[1], "") if rater[0] == "u" else (None, rater[1])


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
encode = _ENCODER.encode


def _number(value: float | None) -> str:
    return "null" if value is None else repr(float(value))
