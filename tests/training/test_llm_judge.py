"""The pairwise LLM judge (training.judging.llm) against real HTTP servers.

The real judge is a `transformers serve` process with the tests' tiny random GPT-2: its
replies are noise, so those tests check the protocol (both orders asked on the wire, exact
requests and replies recorded, unreadable replies give no verdict). Judges whose replies the
test controls are plain `http.server` endpoints on loopback ports (external servers, as a
hosted judge would be): they check the position-swap rule, rankings, and failures.
"""

from __future__ import annotations

import json
import re
import time

import pytest
import requests

from tests.training.conftest import free_port
from tests.training.test_generation_faults import completion, http_server
from training.generation.endpoints import InvalidEndpoint
from training.judging import InvalidJudge, JudgeError, LLMJudge, parse_verdict

QUESTION = "What is 2 + 3?"
GOOD, BAD = "2 + 3 = 5.", "No idea."


def _declare(settings, **endpoints) -> None:
    settings.PREFLOOP_GENERATION_ENDPOINTS = {
        name: {"models": ["judge"], "retries": 0, "timeout_seconds": 5, **entry}
        for name, entry in endpoints.items()
    }


def _shown_answers(body: dict) -> tuple[str, str]:
    """Return (answer shown as A, answer shown as B) from a judge request body."""
    text = body["messages"][-1]["content"]
    a = re.search(r"\[Answer A\]\n(.*)\n\[End of answer A\]", text, re.S).group(1)
    b = re.search(r"\[Answer B\]\n(.*)\n\[End of answer B\]", text, re.S).group(1)
    return a, b


def content_judge(prefers: str):
    """Answer like a consistent judge: the slot holding `prefers` wins, whatever its side."""

    def answer(handler, body):
        a, b = _shown_answers(body)
        verdict = "[[A]]" if prefers in a else "[[B]]" if prefers in b else "[[C]]"
        return 200, json.dumps(completion(f"Format: [[A]] or [[B]]. Mine: {verdict}")).encode()

    return answer


def fixed_reply(text: str):
    return lambda handler, body: (200, json.dumps(completion(text)).encode())


def forwarding_to(base_url: str):
    """Relay each request to a real server unchanged (so the test can count what is sent)."""

    def answer(handler, body):
        reply = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)
        return reply.status_code, reply.content

    return answer


def test_verdict_is_the_last_marker_and_c_is_a_tie():
    assert parse_verdict("A is better. [[A]]") == "A"
    assert parse_verdict('Use "[[A]]" or "[[B]]". I pick [[ B ]].') == "B"
    assert parse_verdict("[[C]]") == "tie"
    assert parse_verdict("A is better") is None
    assert parse_verdict("[A]") is None and parse_verdict("") is None


def test_the_real_served_judge_is_asked_both_orders_and_every_exchange_is_recorded(
    settings, served_policy
):
    base_url, model = served_policy
    with http_server(forwarding_to(base_url)) as (url, log):
        settings.PREFLOOP_GENERATION_ENDPOINTS = {
            "served": {"base_url": url, "models": [model], "timeout_seconds": 120}
        }
        for policy in ("tie", "skip"):
            judge = LLMJudge(
                endpoint="served",
                model=model,
                rubric="Correct sums win.",
                on_disagreement=policy,
                max_new_tokens=6,
            )
            before = len(log["bodies"])
            verdict = judge.compare(QUESTION, GOOD, BAD)

            # Two requests went to the real server: GOOD shown first, then BAD shown first.
            sent = log["bodies"][before:]
            assert len(sent) == 2
            assert sorted(_shown_answers(b) for b in sent) == sorted([(GOOD, BAD), (BAD, GOOD)])
            for body in sent:
                assert body["model"] == model and body["temperature"] == 0.0
                assert "Correct sums win." in body["messages"][0]["content"]
                assert QUESTION in body["messages"][-1]["content"]
            original, swapped = verdict.exchanges
            assert (original.order, swapped.order) == ("original", "swapped")
            assert _shown_answers(original.request["body"]) == (GOOD, BAD)
            assert _shown_answers(swapped.request["body"]) == (BAD, GOOD)
            assert [e.request["body"] for e in verdict.exchanges] == sorted(
                sent, key=lambda b: _shown_answers(b) != (GOOD, BAD)
            )
            # The replies are the model's text as served (noise from a random model).
            assert all(e.response["finish_reason"] for e in verdict.exchanges)
            assert all(e.shown_verdict == parse_verdict(e.reply) for e in verdict.exchanges)
            if all(e.verdict is None for e in verdict.exchanges):
                assert verdict.outcome == "unparseable" and not verdict.decided
                assert verdict.winner == ("tie" if policy == "tie" else None)
            json.dumps(verdict.as_dict())  # the audit record is plain JSON


def test_a_verdict_counts_only_when_both_orders_agree(settings):
    with (
        http_server(content_judge(prefers="= 5")) as (consistent, consistent_log),
        http_server(fixed_reply("Clearly [[A]].")) as (biased, biased_log),
        http_server(fixed_reply("Both are fine, hard to say.")) as (vague, _),
    ):
        _declare(
            settings,
            consistent={"base_url": consistent},
            biased={"base_url": biased},
            vague={"base_url": vague},
        )
        verdict = LLMJudge(endpoint="consistent", model="judge").compare(QUESTION, BAD, GOOD)
        assert (verdict.winner, verdict.outcome, verdict.decided) == ("B", "agreed", True)
        assert [e.shown_verdict for e in verdict.exchanges] == ["B", "A"]
        assert len(consistent_log["bodies"]) == 2

        # Always "A": the two orders contradict each other, so no side wins.
        for policy, winner in (("tie", "tie"), ("skip", None)):
            judge = LLMJudge(endpoint="biased", model="judge", on_disagreement=policy)
            verdict = judge.compare(QUESTION, GOOD, BAD)
            assert (verdict.winner, verdict.outcome) == (winner, "disagreed")
            assert [e.verdict for e in verdict.exchanges] == ["A", "B"]
        assert len(biased_log["bodies"]) == 4

        for policy, winner in (("tie", "tie"), ("skip", None)):
            judge = LLMJudge(endpoint="vague", model="judge", on_disagreement=policy)
            verdict = judge.compare(QUESTION, GOOD, BAD)
            assert (verdict.winner, verdict.outcome) == (winner, "unparseable")
            assert verdict.exchanges[0].reply == "Both are fine, hard to say."


def test_a_chat_prompt_is_shown_as_a_transcript(settings):
    with http_server(content_judge(prefers="= 5")) as (url, log):
        _declare(settings, consistent={"base_url": url})
        chat = [
            {"role": "user", "content": "Add two numbers."},
            {"role": "assistant", "content": "Which ones?"},
            {"role": "user", "content": QUESTION},
        ]
        verdict = LLMJudge(endpoint="consistent", model="judge").compare(chat, GOOD, BAD)
        assert verdict.winner == "A"
        shown = log["bodies"][0]["messages"][-1]["content"]
        assert "assistant: Which ones?" in shown and f"user: {QUESTION}" in shown


def test_k_answers_are_ranked_by_copeland_score_over_all_pairs_both_orders(settings):
    def by_exclamations(handler, body):
        a, b = _shown_answers(body)
        verdict = "[[C]]" if a.count("!") == b.count("!") else "[[A]]"
        if a.count("!") < b.count("!"):
            verdict = "[[B]]"
        return 200, json.dumps(completion(verdict)).encode()

    with http_server(by_exclamations) as (url, log):
        _declare(settings, ranker={"base_url": url})
        answers = ["one!", "none", "three!!!", "also one!"]
        ranking = LLMJudge(endpoint="ranker", model="judge").rank(QUESTION, answers)
        assert len(log["bodies"]) == 2 * 6  # 6 pairs, each in both orders
        assert ranking.scores == (0, -3, 3, 0)
        assert ranking.ranks == (2, 3, 1, 2)
        assert ranking.decided_pairs == 6
        assert [(i, j) for i, j, _ in ranking.pairs] == [
            (0, 1),
            (0, 2),
            (0, 3),
            (1, 2),
            (1, 3),
            (2, 3),
        ]


def test_endpoint_failures_raise_a_clear_error(settings):
    def slow(handler, body):
        time.sleep(2)
        return 200, json.dumps(completion("[[A]]")).encode()

    with (
        http_server(lambda h, b: (200, b"{not json")) as (garbled, _),
        http_server(lambda h, b: (200, b'{"choices": []}')) as (empty, _),
        http_server(slow) as (slow_url, _),
    ):
        _declare(
            settings,
            garbled={"base_url": garbled},
            empty={"base_url": empty},
            slow={"base_url": slow_url, "timeout_seconds": 0.5},
            down={"base_url": f"http://127.0.0.1:{free_port()}"},
        )
        expected = {
            "garbled": "not valid JSON",
            "empty": "not a chat completion",
            "slow": "no answer within 0.5 s",
            "down": "does not answer",
        }
        for name, message in expected.items():
            with pytest.raises(JudgeError, match=message):
                LLMJudge(endpoint=name, model="judge").compare(QUESTION, GOOD, BAD)


def test_only_declared_endpoints_and_known_settings_are_accepted(settings, monkeypatch):
    with http_server(content_judge(prefers="= 5")) as (url, log):
        _declare(settings, keyed={"base_url": url, "api_key_env": "JUDGE_KEY_FOR_TEST"})
        with pytest.raises(InvalidEndpoint) as unknown:
            LLMJudge(endpoint="http://10.0.0.1/v1", model="judge")
        assert unknown.value.field == "endpoint"
        with pytest.raises(InvalidEndpoint) as model:
            LLMJudge(endpoint="keyed", model="gpt-9")
        assert model.value.field == "model"
        with pytest.raises(InvalidJudge) as policy:
            LLMJudge(endpoint="keyed", model="judge", on_disagreement="left")
        assert policy.value.field == "on_disagreement"

        monkeypatch.delenv("JUDGE_KEY_FOR_TEST", raising=False)
        with pytest.raises(JudgeError, match="JUDGE_KEY_FOR_TEST"):
            LLMJudge(endpoint="keyed", model="judge")
        assert log["bodies"] == []

        monkeypatch.setenv("JUDGE_KEY_FOR_TEST", "judge-secret-123")
        verdict = LLMJudge(endpoint="keyed", model="judge").compare(QUESTION, GOOD, BAD)
        assert verdict.winner == "A"
        assert {h["Authorization"] for h in log["headers"]} == {"Bearer judge-secret-123"}
        assert "judge-secret-123" not in json.dumps(verdict.as_dict())
