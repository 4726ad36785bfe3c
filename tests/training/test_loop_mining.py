"""Prompt selection for the next round (hard-example mining) and the loop's beat schedule.

Reward models are real tiny GPT-2 classifiers; every expected order is worked out here from
`training.scoring.reward_scores`, apart from the code under test.
"""

from __future__ import annotations

import json
import random
from itertools import combinations

import pytest

from annotation.imports import content_hash
from annotation.models import DatasetVersion, Judgment, Prompt, Round
from tests.factories import make_items, make_project, make_round, make_user
from training import loop, rounds
from training.loop import control
from training.models import ModelVersion, TrainingRun
from training.scoring import reward_scores

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="session")
def other_reward_dir(tmp_path_factory, tiny_tokenizer):
    """Return a second tiny reward model, initialised from another seed."""
    from training.trainers.tiny import build_tiny_reward_model

    out = tmp_path_factory.mktemp("reward_model_b")
    return build_tiny_reward_model(tiny_tokenizer, out, n_layer=2, n_embd=64, n_head=2, seed=1)


ANSWERS = [
    "Sure! 3 + 4 = 7.",
    "I don't know.",
    "No idea.",
    "Ask someone else.",
    "Maybe later.",
    "The answer is 12.",
    "Ugh, obviously 9.",
    "5 + 5 = 10.",
    "Hmm, let me think. 8.",
    "It is 2 + 2 = 4.",
]


def make_answered_items(project, n: int, **kwargs):
    """Create items whose candidates are different kinds of answer, so models rank them apart."""
    # A fixed seed, not the project's pk: ids depend on the tests that ran before.
    rng = random.Random(2)
    items = make_items(project, n, **kwargs)
    for i, item in enumerate(items):
        # Prompt texts of their own too: the factory's carry a global serial, and the models'
        # scores (so the expected orders and the distinct shares) would change with test order.
        item.prompt.text = f"Answered prompt {i}?"
        item.prompt.content_hash = content_hash(item.prompt.text)
        item.prompt.save(update_fields=["text", "content_hash"])
        answers = rng.sample(ANSWERS, project.k)
        for slot, text in zip(item.slots.order_by("position"), answers, strict=True):
            slot.candidate.text = text
            slot.candidate.content_hash = content_hash(text)
            slot.candidate.save(update_fields=["text", "content_hash"])
    return items


def register_reward_model(project, path, *, dataset_version=None) -> ModelVersion:
    run = TrainingRun.objects.create(
        recipe="reward", project=project, status=TrainingRun.Status.SUCCEEDED
    )
    return ModelVersion.objects.create(
        name=f"reward-run-{run.pk}",
        kind=ModelVersion.Kind.REWARD,
        artifact_path=str(path),
        training_run=run,
        dataset_version=dataset_version,
    )


def add_pool_prompts(project, n: int) -> list[str]:
    texts = [f"Unused pool prompt {project.pk}-{i}?" for i in range(n)]
    for text in texts:
        Prompt.objects.create(
            project=project, text=text, content_hash=content_hash(text), in_pool=True
        )
    return texts


def pool_settings(mode: str, *, n: int = 10, random_share: float = 0.3) -> loop.LoopSettings:
    return loop.LoopSettings(
        path="dpo",
        prompt_source="pool",
        n_prompts=n,
        random_share=random_share,
        hard_mining=mode,
        seed=3,
    )


def candidate_scores(path, item, prompt=None) -> list[float]:
    answers = [slot.candidate.text for slot in item.slots.order_by("position")]
    if prompt is None:
        prompt = item.prompt.messages or item.prompt.text
    return reward_scores(str(path), prompt, answers)


def fresh_only(project) -> list[str]:
    return loop.prompts_select(project=project, settings=pool_settings(""))


def key(prompt) -> str:
    """A chosen prompt (text, or chat messages) as a comparable string."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def assert_hard_then_fresh(chosen: list, expected_hard: list, n: int) -> None:
    assert len(chosen) == n
    assert len({key(p) for p in chosen}) == n, "a prompt was chosen twice"
    assert chosen[: len(expected_hard)] == expected_hard
    assert {key(p) for p in chosen[len(expected_hard) :]}.isdisjoint(map(key, expected_hard))


# --------------------------------------------------------------------------- rm_margin


def test_rm_margin_puts_the_smallest_score_gaps_first_and_keeps_the_random_share(
    tiny_reward_dir,
):
    # Given a round of 12 items (one gold) whose prompts are partly chat transcripts
    project = make_project()
    items = make_answered_items(project, 12, gold=["A"])
    for item in items[1::2]:
        item.prompt.messages = [{"role": "user", "content": f"chat {item.prompt.text}"}]
        item.prompt.save(update_fields=["messages"])
    add_pool_prompts(project, 15)
    register_reward_model(project, tiny_reward_dir)
    margins = []
    for item in items[1:]:
        scores = candidate_scores(tiny_reward_dir, item)
        # A chat prompt is chosen as its messages, as the policy is asked it.
        margins.append((max(scores) - min(scores), item.prompt.messages or item.prompt.text))
    expected = [prompt for _, prompt in sorted(margins, key=lambda m: m[0])][:7]

    # When 10 prompts are chosen with 30% kept random
    chosen = loop.prompts_select(project=project, settings=pool_settings("rm_margin"))

    # Then 7 are the smallest-margin prompts, in order, and 3 are other, fresh ones
    assert_hard_then_fresh(chosen, expected, 10)
    assert items[0].prompt.text not in chosen[:7]


@pytest.mark.parametrize(("random_share", "n_hard"), [(0.0, 10), (1.0, 0), (0.55, 4)])
def test_rm_margin_takes_round_n_times_one_minus_random_share_hard_prompts(
    tiny_reward_dir, random_share, n_hard
):
    project = make_project()
    items = make_answered_items(project, 12)
    add_pool_prompts(project, 30)
    register_reward_model(project, tiny_reward_dir)
    margins = sorted(
        (max(s) - min(s), item.prompt.text)
        for item in items
        for s in [candidate_scores(tiny_reward_dir, item)]
    )
    expected = [text for _, text in margins][:n_hard]

    chosen = loop.prompts_select(
        project=project, settings=pool_settings("rm_margin", random_share=random_share)
    )

    assert_hard_then_fresh(chosen, expected, 10)
    if n_hard == 0:
        assert chosen == fresh_only(project)


def test_rm_margin_scores_text_prompts_as_a_user_turn_for_a_chat_trained_model(
    tiny_reward_dir,
):
    # The loop exports conversational rows, so its reward models never saw bare text prompts.
    project = make_project()
    items = make_answered_items(project, 8)
    add_pool_prompts(project, 10)
    dataset = DatasetVersion.objects.create(
        project=project, version=1, report={"conversational": True}
    )
    model = register_reward_model(project, tiny_reward_dir, dataset_version=dataset)
    margins = []
    for item in items:
        chat = [{"role": "user", "content": item.prompt.text}]
        scores = candidate_scores(tiny_reward_dir, item, prompt=chat)
        margins.append((max(scores) - min(scores), item.prompt.text))
    expected = [text for _, text in sorted(margins)]

    chosen = loop.prompts_select(
        project=project,
        settings=pool_settings("rm_margin", n=8, random_share=0.0),
        reward_models=[model],
    )

    assert chosen == expected


# --------------------------------------------------------------------------- rm_disagreement


def test_rm_disagreement_ranks_by_share_of_pairs_the_two_models_order_differently(
    tiny_reward_dir, other_reward_dir
):
    # Given a 3-way ranking round and two reward models (the second registered is the newest)
    project = make_project(task_kind="ranking", k=3)
    items = make_answered_items(project, 12)
    add_pool_prompts(project, 15)
    register_reward_model(project, tiny_reward_dir)
    register_reward_model(project, other_reward_dir)
    ranked = []
    for item in items:
        newer = candidate_scores(other_reward_dir, item)
        older = candidate_scores(tiny_reward_dir, item)
        disagree, margin = 0, 0.0
        for i, j in combinations(range(3), 2):
            d_newer, d_older = newer[i] - newer[j], older[i] - older[j]
            disagree += (d_newer > 0) != (d_older > 0)
            margin += abs(d_newer) + abs(d_older)
        ranked.append((-disagree / 3, margin / 3, item.prompt.text))
    ranked.sort()
    assert len({share for share, *_ in ranked}) >= 3, "too few distinct shares to test the order"
    expected = [text for *_, text in ranked][:7]

    chosen = loop.prompts_select(project=project, settings=pool_settings("rm_disagreement"))

    assert_hard_then_fresh(chosen, expected, 10)


def test_rm_disagreement_with_one_reward_model_chooses_fresh_prompts_only(tiny_reward_dir):
    project = make_project()
    make_answered_items(project, 12)
    add_pool_prompts(project, 30)
    register_reward_model(project, tiny_reward_dir)

    chosen = loop.prompts_select(project=project, settings=pool_settings("rm_disagreement"))

    assert chosen == fresh_only(project)
    assert len(set(chosen)) == 10


# --------------------------------------------------------------------------- human_rm


def vote(project, item, annotators, choices, *, source="human"):
    for annotator, choice in zip(annotators, choices, strict=False):
        Judgment.objects.create(
            project=project, item=item, annotator=annotator, choice=choice, source=source
        )


def test_human_rm_puts_items_the_reward_model_gets_wrong_first(tiny_reward_dir):
    # Given pairwise items whose human majority is set against or with the model's choice
    project = make_project()
    items = make_answered_items(project, 9)
    add_pool_prompts(project, 20)
    register_reward_model(project, tiny_reward_dir)
    users = [make_user() for _ in range(5)]
    scores = [candidate_scores(tiny_reward_dir, item) for item in items]
    model_pick = ["A" if s[0] > s[1] else "B" for s in scores]
    other = {"A": "B", "B": "A"}
    # (humans with the model, humans against it) per item
    plans = [(0, 3), (1, 2), (1, 2), (1, 3), (2, 0), (3, 2), (1, 1)]
    for item, pick, (with_model, against) in zip(items, model_pick, plans, strict=False):
        vote(project, item, users, [pick] * with_model + [other[pick]] * against)
    # item 7: a tie and a both-bad only; item 8: simulated labels only
    vote(project, items[7], users, ["tie", "both_bad"])
    vote(project, items[8], users, [other[model_pick[8]]] * 3, source="simulated")

    wrong, right = [], []
    for item, s, pick, (with_model, against) in zip(
        items, scores, model_pick, plans[:6], strict=False
    ):
        human = 0 if (other[pick] if against > with_model else pick) == "A" else 1
        margin = s[human] - s[1 - human]
        share = max(with_model, against) / (with_model + against)
        if margin < 0:
            wrong.append((-share, margin, item.prompt.text))
        else:
            right.append((margin, share, item.prompt.text))
    assert len(wrong) == 4 and len(right) == 2
    expected = [text for *_, text in sorted(wrong)] + [text for *_, text in sorted(right)]

    # When 10 prompts are chosen, 7 of them hard if there are that many
    chosen = loop.prompts_select(project=project, settings=pool_settings("human_rm"))

    # Then the 6 items with a human majority come first, the rest is fresh
    assert_hard_then_fresh(chosen, expected, 10)
    for skipped in items[6:]:
        assert skipped.prompt.text not in chosen[:6]


def test_human_rm_reads_rankings_by_mean_rank(tiny_reward_dir):
    project = make_project(task_kind="ranking", k=3)
    items = make_answered_items(project, 4)
    add_pool_prompts(project, 10)
    register_reward_model(project, tiny_reward_dir)
    users = [make_user() for _ in range(3)]
    scores = [candidate_scores(tiny_reward_dir, item) for item in items]
    expected_wrong, expected_right = [], []
    for item, s in zip(items, scores, strict=True):
        worst = min(range(3), key=lambda pos: s[pos])
        best = max(range(3), key=lambda pos: s[pos])
        human_top = worst if item is not items[3] else best
        # Two annotators rank human_top first, one ranks it second: mean rank 4/3, share 2/3.
        rest = [pos for pos in range(3) if pos != human_top]
        orders = [[human_top, *rest], [human_top, *rest[::-1]], [rest[0], human_top, rest[1]]]
        for annotator, order in zip(users, orders, strict=True):
            ranks = [order.index(pos) + 1 for pos in range(3)]
            Judgment.objects.create(project=project, item=item, annotator=annotator, ranking=ranks)
        margin = s[human_top] - max(s[pos] for pos in rest)
        if margin < 0:
            expected_wrong.append((margin, item.prompt.text))
        else:
            expected_right.append((margin, item.prompt.text))
    expected = [t for _, t in sorted(expected_wrong)] + [t for _, t in sorted(expected_right)]
    assert len(expected_wrong) == 3

    chosen = loop.prompts_select(
        project=project, settings=pool_settings("human_rm", n=6, random_share=0.0)
    )

    assert chosen[:4] == expected
    assert len(chosen) == 6 and len(set(chosen)) == 6


@pytest.mark.parametrize("mode", ["rm_margin", "rm_disagreement", "human_rm"])
def test_mining_without_a_reward_model_chooses_fresh_prompts_only(mode):
    project = make_project()
    items = make_answered_items(project, 12)
    add_pool_prompts(project, 30)
    vote(project, items[0], [make_user(), make_user()], ["A", "A"])

    chosen = loop.prompts_select(project=project, settings=pool_settings(mode))

    assert chosen == fresh_only(project)
    assert len(set(chosen)) == 10


def test_human_rm_without_human_labels_chooses_fresh_prompts_only(tiny_reward_dir):
    project = make_project()
    items = make_answered_items(project, 12)
    add_pool_prompts(project, 30)
    register_reward_model(project, tiny_reward_dir)
    vote(project, items[0], [make_user(), make_user()], ["A", "A"], source="simulated")

    chosen = loop.prompts_select(project=project, settings=pool_settings("human_rm"))

    assert chosen == fresh_only(project)


# --------------------------------------------------------------------------- disagreement


def test_disagreement_puts_the_most_even_splits_first():
    project = make_project()
    items = make_answered_items(project, 4)
    add_pool_prompts(project, 10)
    users = [make_user() for _ in range(4)]
    vote(project, items[0], users, ["A", "A", "A", "B"])
    vote(project, items[1], users, ["A", "B"])
    vote(project, items[2], users, ["B", "B"])
    vote(project, items[3], users, ["A", "B", "B"])

    chosen = loop.prompts_select(project=project, settings=pool_settings("disagreement", n=5))

    # 4 of 5 would be hard; only 3 items split, so 2 fresh prompts fill the round
    assert_hard_then_fresh(chosen, [items[i].prompt.text for i in (1, 3, 0)], 5)


# --------------------------------------------------------------------------- generate_round_now


def test_generate_round_now_mines_the_last_labelled_round_with_the_two_newest_models(
    monkeypatch, tmp_path, tiny_reward_dir, other_reward_dir
):
    # Given three reward models and a labelled round, then the next round opened but still empty
    # (the loop creates it before the gpu task generates into it)
    project = make_project()
    labelled = make_round(project)
    make_answered_items(project, 12, round_=labelled)
    add_pool_prompts(project, 15)
    register_reward_model(project, tmp_path / "gone")  # the oldest: scoring it would fail
    older = register_reward_model(project, tiny_reward_dir)
    newer = register_reward_model(project, other_reward_dir)
    policy = ModelVersion.objects.create(name=f"policy-{project.pk}", artifact_path="unused")
    Round.objects.create(project=project, number=2, model_version=policy, source_key="k:gen")
    settings = pool_settings("rm_disagreement")
    expected = loop.prompts_select(project=project, settings=settings, reward_models=[newer, older])
    captured = {}

    def fake_round_generate(*, prompts, **kwargs):
        captured["prompts"] = prompts
        return Round.objects.get(project=project, number=2)

    monkeypatch.setattr(rounds, "round_generate", fake_round_generate)

    loop.generate_round_now(
        project_id=project.pk,
        model_version_id=policy.pk,
        source_key="k:gen",
        settings=settings.to_dict(),
    )

    assert captured["prompts"] == expected
    assert set(expected[:7]) <= {item.prompt.text for item in labelled.items.all()}


# --------------------------------------------------------------------------- schedule


def schedule_of(project):
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.filter(name=f"prefloop-loop-{project.pk}")


def test_loop_schedule_set_creates_one_task_and_updates_it_on_a_second_call():
    project = make_project()

    loop.loop_schedule_set(project=project, every_seconds=30)
    loop.loop_schedule_set(project=project, every_seconds=120)

    assert schedule_of(project).count() == 1
    task = schedule_of(project).get()
    assert task.task == loop.LOOP_TASK
    assert task.enabled
    assert task.interval.every == 120
    # The schedule carries only the project: the settings live on the project's Loop row.
    assert json.loads(task.kwargs) == {"project_id": project.pk}


def test_loop_schedule_pause_disables_and_resume_enables_it():
    project = make_project()
    loop.loop_schedule_set(project=project)

    assert loop.loop_schedule_pause(project=project, paused=True) is True
    assert schedule_of(project).get().enabled is False
    assert loop.loop_schedule_pause(project=project, paused=False) is True
    assert schedule_of(project).get().enabled is True


def test_pausing_a_project_without_a_schedule_returns_false():
    project = make_project()
    other = make_project()
    loop.loop_schedule_set(project=other)

    assert loop.loop_schedule_pause(project=project, paused=True) is False
    assert not schedule_of(project).exists()
    assert schedule_of(other).get().enabled is True


def test_the_scheduled_task_is_registered_and_accepts_the_schedule_kwargs():
    from config.celery import app

    project = make_project()
    control.loop_create(project=project, settings=pool_settings("rm_margin").to_dict())
    task = loop.loop_schedule_set(project=project)

    # As a worker or beat does at start-up: import the modules autodiscovery names.
    app.loader.import_default_modules()
    assert loop.LOOP_TASK in app.tasks
    # A project without a round yet: the tick runs and reports that it has nothing to do.
    steps = app.tasks[loop.LOOP_TASK](**json.loads(task.kwargs))
    assert steps == [("start", "skipped", "no round yet")]


def test_a_tick_queued_before_a_pause_does_nothing():
    from training.loop_tasks import loop_tick

    project = make_project()
    make_items(project, 2)
    control.loop_create(project=project, settings=pool_settings("rm_margin").to_dict())
    task = loop.loop_schedule_set(project=project)
    kwargs = json.loads(task.kwargs)
    assert loop_tick(**kwargs) == [("wait", "waiting", "round 1 needs more labels")]
    control.loop_pause(project=project)
    assert loop_tick(**kwargs) == [("tick", "skipped", "the project's loop is paused")]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"path": "dpo", "hard_mining": "margin"}, "hard_mining must be one of"),
        ({"path": "dpo", "random_share": 1.5}, "random_share must be between 0 and 1"),
        ({"path": "ppo"}, "path must be"),
        ({"n_prompts": 3}, "path must be chosen"),
        ({"n_prompt": 3}, "unknown loop setting"),
    ],
)
def test_bad_loop_settings_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        loop.LoopSettings.from_dict(values)
