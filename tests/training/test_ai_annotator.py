"""A registered reward model labels through the HTTP API as an AI annotator (source "ai")."""

import pytest
from django.core.management import CommandError, call_command

from annotation.errors import ServiceError
from annotation.exports import dataset_version_export
from annotation.imports import content_hash
from annotation.models import (
    Candidate,
    DatasetVersion,
    Item,
    ItemCandidate,
    Judgment,
    Project,
    Prompt,
    Round,
)
from annotation.simulation import model_judge
from evaluation.selectors import project_agreement
from training.models import ModelVersion
from training.scoring import reward_scores

pytestmark = pytest.mark.django_db(transaction=True)

QUESTIONS = [f"What is {a} + {b}?" for a, b in [(2, 3), (7, 1), (4, 4), (9, 2), (6, 5), (3, 8)]]
ANSWERS = [
    ("The answer is {s}. Happy to help!", "ugh. {w}"),
    ("{s}", "I think it is {w}, thanks for asking."),
]


def _project(task_kind: str = "pairwise") -> Project:
    k = 2 if task_kind == "pairwise" else 3
    project = Project.objects.create(name="ai", overlap=2, task_kind=task_kind, k=k)
    round_ = Round.objects.create(project=project, number=1)
    for q, question in enumerate(QUESTIONS):
        a, b = (int(x) for x in question[8:-1].split(" + "))
        if q == 0:  # one chat prompt: the judge must score the conversation, not only text
            messages = [{"role": "user", "content": question}]
            prompt = Prompt.objects.create(
                project=project, messages=messages, content_hash=content_hash(question + "#chat")
            )
        else:
            prompt = Prompt.objects.create(
                project=project, text=question, content_hash=content_hash(question)
            )
        item = Item.objects.create(project=project, round=round_, prompt=prompt)
        good, bad = ANSWERS[q % 2]
        texts = [good.format(s=a + b), bad.format(w=a + b + 1), f"Maybe {a * b}?"][:k]
        for position, text in enumerate(texts):
            candidate = Candidate.objects.create(
                prompt=prompt, text=text, content_hash=content_hash(text)
            )
            ItemCandidate.objects.create(item=item, candidate=candidate, position=position)
    return project


def _reward_version(path, name="rm") -> ModelVersion:
    return ModelVersion.objects.create(
        name=name, kind=ModelVersion.Kind.REWARD, artifact_path=str(path)
    )


def _prompt_of(item: Item):
    return item.prompt.messages or item.prompt.text


def _simulate(project: Project, url: str, *args: str) -> None:
    call_command("simulate", "--project", str(project.pk), "--url", url, *args)


def _canonical_scores(path, item: Item) -> list[float]:
    texts = [s.candidate.text for s in item.slots.order_by("position")]
    return reward_scores(path, _prompt_of(item), texts)


def test_reward_model_labels_pairs_through_the_api_as_ai(live_server, tiny_reward_dir):
    project = _project()
    version = _reward_version(tiny_reward_dir)
    _simulate(
        project, live_server.url, "--pool", "careful:1", "--ai-model-version", str(version.pk)
    )
    ai = Judgment.objects.filter(annotator__username=f"ai-rm-{version.pk}")
    assert ai.count() == len(QUESTIONS)
    assert set(ai.values_list("source", flat=True)) == {"ai"}
    assert set(Judgment.objects.exclude(pk__in=ai).values_list("source", flat=True)) == {
        "simulated"
    }
    compared = 0
    for judgment in ai.select_related("item__prompt"):
        scores = _canonical_scores(tiny_reward_dir, judgment.item)
        if abs(scores[0] - scores[1]) < 1e-5:  # too close to call across batch orders
            continue
        # Stored canonically whatever side the model saw each answer on.
        assert judgment.choice == ("A" if scores[0] > scores[1] else "B")
        compared += 1
    assert compared >= len(QUESTIONS) - 1

    # AI labels never mix silently with others: exports take human labels unless asked,
    # and agreement reports them as their own source, compared per round.
    with pytest.raises(ServiceError, match=f'"source_ai": {len(QUESTIONS)}'):
        dataset_version_export(project=project, policy={"hf": False, "split": {"train": 1.0}})
    chosen = dataset_version_export(
        project=project, policy={"hf": False, "split": {"train": 1.0}, "sources": ["ai"]}
    )
    assert chosen.report["judgments"]["included_by_source"] == {"ai": len(QUESTIONS)}
    report = project_agreement(project=project, n_boot=50)
    assert "ai" in report["sources"] and "simulated" in report["sources"]
    assert report["by_source"]["ai"]["n_judgments"] == len(QUESTIONS)


def test_reward_model_ranks_k_candidates_by_score(live_server, tiny_reward_dir):
    project = _project("ranking")
    version = _reward_version(tiny_reward_dir)
    _simulate(project, live_server.url, "--pool", "", "--ai-model-version", str(version.pk))
    judgments = Judgment.objects.filter(source="ai").select_related("item__prompt")
    assert judgments.count() == len(QUESTIONS)
    compared = 0
    for judgment in judgments:
        scores = _canonical_scores(tiny_reward_dir, judgment.item)
        low, middle, high = sorted(scores)
        if middle - low > 1e-5 and high - middle > 1e-5:
            expected = [1 + sum(other > score for other in scores) for score in scores]
            assert judgment.ranking == expected
            compared += 1
    assert compared >= len(QUESTIONS) - 1


def test_model_judge_ties_only_within_the_margin_and_only_when_allowed():
    payload = {"prompt": {"text": "q", "messages": None}, "candidates": [{"text": "x"}] * 2}
    options = {"task_kind": "pairwise", "choices": ["A", "B", "tie"]}

    def scores(values):
        return lambda prompt, answers: values

    assert model_judge(scores([0.2, 0.1]))(payload, options) == {"choice": "A"}
    assert model_judge(scores([0.2, 0.1]), tie_margin=0.2)(payload, options) == {"choice": "tie"}
    no_tie = {"task_kind": "pairwise", "choices": ["A", "B"]}
    assert model_judge(scores([0.1, 0.1]), tie_margin=0.2)(payload, no_tie) == {"choice": "B"}
    ranking = {"task_kind": "ranking", "choices": [], "allow_tied_ranks": False}
    payload3 = {**payload, "candidates": [{"text": "x"}] * 3}
    judge = model_judge(scores([0.5, 0.9, 0.5]))
    assert judge(payload3, ranking) == {"ranking": [2, 1, 3]}
    assert judge(payload3, {**ranking, "allow_tied_ranks": True}) == {"ranking": [2, 1, 2]}


def test_only_existing_reward_models_can_label(tiny_reward_dir, tmp_path):
    project = _project()
    policy = ModelVersion.objects.create(
        name="policy", kind=ModelVersion.Kind.POLICY, artifact_path=str(tiny_reward_dir)
    )
    gone = _reward_version(tmp_path / "missing", name="gone")
    cases = [
        (["--ai-model-version", str(policy.pk)], "not a reward model"),
        (["--ai-model-version", str(gone.pk)], "no model folder"),
        (["--ai-model-version", "99999"], "No model version"),
        (["--pool", ""], "Nothing to run"),
    ]
    for extra, message in cases:
        with pytest.raises(CommandError, match=message):
            call_command("simulate", "--project", str(project.pk), *extra)
    assert not Judgment.objects.exists()


def test_a_chat_trained_reward_model_sees_text_prompts_as_a_user_turn(live_server, tiny_reward_dir):
    # The loop exports conversational rows: its reward models never saw a bare text prompt.
    project = _project()
    dataset = DatasetVersion.objects.create(
        project=project, version=1, report={"conversational": True}
    )
    version = ModelVersion.objects.create(
        name="rm-chat",
        kind=ModelVersion.Kind.REWARD,
        artifact_path=str(tiny_reward_dir),
        dataset_version=dataset,
    )
    _simulate(project, live_server.url, "--pool", "", "--ai-model-version", str(version.pk))
    as_chat = as_text = 0
    for judgment in Judgment.objects.filter(source="ai").select_related("item__prompt"):
        texts = [s.candidate.text for s in judgment.item.slots.order_by("position")]
        prompt = judgment.item.prompt
        chat = reward_scores(
            tiny_reward_dir, prompt.messages or [{"role": "user", "content": prompt.text}], texts
        )
        plain = _canonical_scores(tiny_reward_dir, judgment.item)
        as_chat += judgment.choice == ("A" if chat[0] > chat[1] else "B")
        as_text += judgment.choice == ("A" if plain[0] > plain[1] else "B")
    assert as_chat == len(QUESTIONS) and as_text < len(QUESTIONS)
