"""Policy samples on the Models page: what the reward model rewards in one policy version.

Everything comes from what the loop's evaluation stored (`training.policy_eval`): the
version's ``eval_results["generation"]`` (each evaluation prompt with the policy's answer and
its KL to the reference and to the base, text statistics, the opponents' answers) and the
reward-model judge's `PolicyEvaluation` row (the score of every answer). Answers are model
output: untrusted text, shown through the templates' escaping only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from annotation.models import Project
from config.console.dashboard.panel import MAX_SAMPLE_CHARS, Panel, clip, empty, messages_text
from config.console.dashboard.specs import (
    LinesChart,
    LinesSeries,
    ScatterChart,
    ScatterPoint,
    ScatterSeries,
)
from training.loop.gate import project_policies
from training.models import ModelVersion, PolicyEvaluation

MAX_SHOWN = 5
# Versions drawn in the reward vs KL scatter besides the selected one (newest first).
MAX_SCATTER_VERSIONS = 6

OVEROPTIMISATION_NOTE = (
    "A reward model is a proxy: pushed far enough from the policy it was trained on, its "
    "score keeps rising while the true quality falls (Gao et al. 2023, Scaling Laws for Reward "
    "Model Overoptimization). Answers with a high reward and a high KL are where to look first."
)


@dataclass(frozen=True)
class Sample:
    """One evaluation prompt: the policy's answer, its reward and KL, the previous answer."""

    number: int  # position in the evaluation's seeded prompt sample, from 1
    prompt: str
    answer: str
    reward: float | None
    kl_reference: float | None
    kl_base: float | None
    previous_answer: str | None
    previous_reward: float | None


@dataclass(frozen=True)
class PolicySamples:
    """A policy version's evaluated answers and the reward-model judge that scored them."""

    version: ModelVersion
    previous: ModelVersion | None
    judge: str  # "" when no reward-model judge scored the answers
    scored: bool  # the judge row holds per-answer scores (evaluations since they are kept)
    optimised_against: bool  # the policy was trained against this judge's reward model
    samples: list[Sample]


def evaluated_policies(*, project: Project) -> list[ModelVersion]:
    """Return the project's policy versions the loop evaluated, oldest first."""
    return list(
        project_policies(project=project)
        .filter(eval_results__has_key="generation")
        .order_by("created_at", "pk")
    )


def prompt_text(prompt: Any) -> str:
    """Return an evaluation prompt (text or chat messages) as text."""
    return prompt if isinstance(prompt, str) else messages_text(prompt)


def policy_samples(*, version: ModelVersion) -> PolicySamples:
    """Return a version's evaluated answers with the reward-model judge's scores."""
    record = version.eval_results["generation"]
    previous_id = record["previous_id"]
    judges = list(
        PolicyEvaluation.objects.filter(
            policy=version, judge_kind=PolicyEvaluation.JudgeKind.REWARD_MODEL
        ).order_by("pk")
    )
    # The reward model the policy was optimised against is the one whose taste it learned
    # (marked by the evaluation when known); otherwise the first judge, the newest reward
    # model. Its row against the previous policy also scored the previous answers.
    judges.sort(
        key=lambda j: (not j.details.get("optimised_against", False), j.opponent_id != previous_id)
    )
    judge = judges[0] if judges else None
    scored = judge is not None and "scores_new" in judge.details
    new_scores = judge.details["scores_new"] if scored else None
    old_scores = (
        judge.details["scores_old"] if scored and judge.opponent_id == previous_id else None
    )
    previous_answers = (record.get("opponent_answers") or {}).get(str(previous_id))
    samples = [
        Sample(
            number=i + 1,
            prompt=prompt_text(sample["prompt"]),
            answer=sample["answer"],
            reward=new_scores[i] if new_scores else None,
            kl_reference=sample["kl_reference"],
            kl_base=sample["kl_base"],
            previous_answer=previous_answers[i] if previous_answers else None,
            previous_reward=old_scores[i] if old_scores else None,
        )
        for i, sample in enumerate(record["samples"])
    ]
    previous = ModelVersion.objects.filter(pk=previous_id).first() if previous_id else None
    return PolicySamples(
        version=version,
        previous=previous,
        judge=judge.judge if judge is not None else "",
        scored=scored,
        optimised_against=bool(judge is not None and judge.details.get("optimised_against")),
        samples=samples,
    )


SAMPLE_COLUMNS = ["prompt #", "reward", "KL to reference", "KL to base", "prompt", "answer"]


def _sample_row(s: Sample) -> list[Any]:
    return [s.number, s.reward, s.kl_reference, s.kl_base, s.prompt, s.answer]


def _groups(data: PolicySamples, chosen: list[Sample]) -> list[dict[str, Any]]:
    return [
        {
            "source": f"prompt {s.number} · reward {_num(s.reward)} · KL to reference "
            f"{_num(s.kl_reference)} · KL to base {_num(s.kl_base)}",
            "prompt": clip(s.prompt),
            "answers": [{"model": data.version.name, "text": clip(s.answer)}],
        }
        for s in chosen
    ]


def _optimised(data: PolicySamples) -> str:
    return ", the reward model this policy was optimised against," if data.optimised_against else ""


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def top_reward_panel(data: PolicySamples) -> Panel:
    """Return the answers the reward-model judge scored highest, with their prompts."""
    key, title = "policy-top-reward", f"Highest-reward answers: {data.version.name}"
    if not data.judge:
        return empty(key, title, "No reward model judged this policy's evaluation.")
    if not data.scored:
        return empty(
            key,
            title,
            "This evaluation was stored before per-answer scores were kept: evaluate the "
            "policy again to see them.",
        )
    ranked = sorted(data.samples, key=lambda s: -s.reward)
    return Panel(
        key=key,
        title=title,
        columns=SAMPLE_COLUMNS,
        rows=[_sample_row(s) for s in ranked],
        show_table=False,
        extra={"groups": _groups(data, ranked[:MAX_SHOWN])},
        note=f"The {MAX_SHOWN} answers {data.judge}{_optimised(data)} scores highest among the "
        "policy's answers to the evaluation prompts (the CSV has all of them). If they read as "
        "long, flattering "
        "or repetitive rather than good, the reward model rewards style. "
        f"Texts are cut at {MAX_SAMPLE_CHARS} characters.",
    )


def top_kl_panel(data: PolicySamples) -> Panel:
    """Return the answers that moved furthest from the reference policy (highest KL)."""
    key, title = "policy-top-kl", f"Highest-KL answers: {data.version.name}"
    with_kl = [s for s in data.samples if s.kl_reference is not None]
    if not with_kl:
        return empty(key, title, "No KL to the reference was measured for this policy.")
    ranked = sorted(with_kl, key=lambda s: -s.kl_reference)
    return Panel(
        key=key,
        title=title,
        columns=SAMPLE_COLUMNS,
        rows=[_sample_row(s) for s in ranked],
        show_table=False,
        extra={"groups": _groups(data, ranked[:MAX_SHOWN])},
        note=f"The {MAX_SHOWN} answers with the largest log p_policy(y|x) - log p_reference(y|x) "
        "(nats; the sequence-level KL estimate of Ziegler et al. 2019, §2.2): where the policy "
        f"left its reference furthest. {OVEROPTIMISATION_NOTE}",
    )


def reward_kl_panel(selected: PolicySamples, versions: list[ModelVersion]) -> Panel:
    """Return each answer's reward against its KL to the base, for versions sharing a judge."""
    key, title = "policy-reward-kl", "Reward vs KL to the base"
    if not selected.scored:
        return empty(key, title, "No per-answer reward-model scores stored for this policy.")
    others = [policy_samples(version=v) for v in versions[::-1] if v.pk != selected.version.pk][
        :MAX_SCATTER_VERSIONS
    ]
    shown = [selected] + [o for o in others if o.scored and o.judge == selected.judge]
    rows = [
        [d.version.name, s.number, s.kl_base, s.kl_reference, s.reward]
        for d in shown
        for s in d.samples
    ]
    chart = ScatterChart(
        series=[
            ScatterSeries(
                name=d.version.name,
                points=[
                    ScatterPoint(x=r[2], y=r[4], label=f"prompt {r[1]}")
                    for r in rows
                    if r[0] == d.version.name
                ],
            )
            for d in shown
        ],
        x_label="KL to the base policy (nats, per answer)",
        y_label=f"reward ({selected.judge})",
    )
    return Panel(
        key=key,
        title=title,
        columns=["policy", "prompt #", "KL to base", "KL to reference", "reward"],
        rows=rows,
        chart=chart,
        note=f"One point per evaluation answer; every version judged by {selected.judge} is "
        "drawn, so its scores compare. Reward rising with KL is expected; a cloud of "
        f"high-KL, high-reward answers that people do not prefer is not. {OVEROPTIMISATION_NOTE}",
    )


def side_by_side_panel(data: PolicySamples) -> Panel:
    """Return the previous version's answer next to this one's on the same prompts."""
    key, title = "policy-vs-previous", f"{data.version.name} next to the previous version"
    if data.previous is None:
        return empty(key, title, "This policy has no previous version to compare with.")
    pairs = [s for s in data.samples if s.previous_answer is not None]
    if not pairs:
        return empty(
            key,
            title,
            "This evaluation was stored before the previous version's answers were kept: "
            "evaluate the policy again to see them.",
        )
    if data.scored and all(s.previous_reward is not None for s in pairs):
        pairs.sort(key=lambda s: -(s.reward - s.previous_reward))
        order = "largest reward gain first"
    else:
        order = "in the evaluation's prompt order"
    new, old = data.version.name, data.previous.name
    rows = [
        [s.number, s.prompt, old, s.previous_answer, s.previous_reward, new, s.answer, s.reward]
        for s in pairs
    ]
    groups = [
        {
            "source": f"prompt {s.number}",
            "prompt": clip(s.prompt),
            "answers": [
                {
                    "model": f"{old} · reward {_num(s.previous_reward)}",
                    "text": clip(s.previous_answer),
                },
                {"model": f"{new} · reward {_num(s.reward)}", "text": clip(s.answer)},
            ],
        }
        for s in pairs[:MAX_SHOWN]
    ]
    return Panel(
        key=key,
        title=title,
        columns=[
            "prompt #",
            "prompt",
            "previous policy",
            "previous answer",
            "previous reward",
            "policy",
            "answer",
            "reward",
        ],
        rows=rows,
        show_table=False,
        extra={"groups": groups},
        note=f"The same evaluation prompts answered by {old} and by {new} with the same "
        f"sampling seed; {MAX_SHOWN} shown, {order} (the CSV has all of them). "
        f"Texts are cut at {MAX_SAMPLE_CHARS} characters.",
    )


TEXT_STATS = (
    ("distinct-1", "distinct_1"),
    ("distinct-2", "distinct_2"),
    ("repetition", "repetition"),
)


def text_stats_panel(versions: list[ModelVersion]) -> Panel:
    """Return distinct-1/2 and repetition of each evaluated version's answers, in order.

    A version the loop compared against but never evaluated itself (the base) is drawn
    from the first evaluation that answered with it.
    """
    key, title = "policy-text-stats", "Diversity and repetition by policy version"
    evaluated = {v.pk for v in versions}
    stats: dict[int, dict] = {}
    for version in versions:
        record = version.eval_results["generation"]
        for pk, opponent in (record.get("opponent_stats") or {}).items():
            if int(pk) not in evaluated and int(pk) not in stats:
                stats[int(pk)] = opponent
        stats[version.pk] = record["stats"]
    if not stats:
        return empty(key, title, "No policy version has been evaluated yet.")
    names = dict(ModelVersion.objects.filter(pk__in=stats).values_list("pk", "name"))
    order = dict(
        ModelVersion.objects.filter(pk__in=stats)
        .order_by("created_at", "pk")
        .values_list("pk", "created_at")
    )
    ordered = sorted(stats, key=lambda pk: (order[pk], pk))
    rows = [
        [
            names[pk],
            "evaluated" if pk in evaluated else "opponent only",
            stats[pk]["n_answers"],
            stats[pk]["mean_length"],
            stats[pk]["distinct_1"],
            stats[pk]["distinct_2"],
            stats[pk]["repetition"],
        ]
        for pk in ordered
    ]
    rep_n = next(iter(stats.values()))["repetition_n"]
    return Panel(
        key=key,
        title=title,
        columns=[
            "policy",
            "figures from",
            "answers",
            "mean length (words)",
            "distinct-1",
            "distinct-2",
            f"repetition (seq-rep-{rep_n})",
        ],
        rows=rows,
        chart=LinesChart(
            labels=[r[0] for r in rows],
            series=[
                LinesSeries(name, [r[4 + i] for r in rows])
                for i, (name, _) in enumerate(TEXT_STATS)
            ],
            x_label="policy version (oldest first)",
            y_label="share",
            percent=True,
        ),
        note="On the same evaluation prompts. Distinct-n: distinct n-grams over all n-grams of "
        "a version's answers (Li et al. 2016); repetition: the share of an answer's "
        f"{rep_n}-grams that repeat an earlier one (Welleck et al. 2019). Diversity falling "
        "and repetition rising round after round is a sign of a policy collapsing onto what "
        "the reward model likes.",
    )
