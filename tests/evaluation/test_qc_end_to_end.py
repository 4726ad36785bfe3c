"""End to end: simulated annotators label over HTTP; QC pauses the bad ones; trust weights help.

Four simulated annotators (careful, noisy, always-left, random clicker) label a demo-domain
project through the real API with hidden gold items (answer = the side with the higher
`training.demo.true_reward`) and planned repeats. After every batch of 20 judgments each,
the on-commit hook `qc_after_submit` is called as `judgment_submit` would call it, with the
Celery task run in process. The always-left and random annotators must be paused within
40 and 80 judgments, the careful one never; and a vote weighted by gold accuracy must
recover the true labels better than a plain majority over the same judgments.
"""

import random
from unittest import mock

import pytest

from annotation import services as annotation_services
from annotation.imports import content_hash
from annotation.models import (
    Candidate,
    Item,
    ItemCandidate,
    Judgment,
    Membership,
    Project,
    Prompt,
    Round,
)
from annotation.simulation import PRESETS, run_pool
from evaluation import selectors, services, tasks
from evaluation.models import AnnotatorAssessment
from evaluation.stats.aggregation import label_accuracy, majority_vote, weighted_vote
from training import demo

pytestmark = pytest.mark.django_db(transaction=True)

N_ITEMS, N_GOLD, BATCH, MAX_BATCHES = 60, 25, 20, 8


def _demo_project() -> tuple[Project, dict[int, str]]:
    """Return a demo-domain project and each item's truly better side.

    Items pit a right answer against a wrong one. Every other gold item is a subtle one (a
    calibration item): two right answers, one of them rude, so gold separates a careful
    annotator from a merely noisy one and not only from bad actors.
    """
    project = Project.objects.create(
        name="qc-e2e", overlap=3, gold_rate=0.25, repeat_rate=0.15, repeat_min_gap=5
    )
    round_ = Round.objects.create(project=project, number=1)
    rng = random.Random(0)
    truth = {}
    for index, text in enumerate(demo.generate_prompts(N_ITEMS + N_GOLD, seed=7)):
        problem = demo.parse_prompt(text)
        right = demo.render_response(problem, rng.choice(["polite", "equation"]), problem.answer)
        is_gold = index >= N_ITEMS
        if is_gold and index % 2:
            worse = demo.render_response(problem, "rude", problem.answer)
        else:
            worse = demo.render_response(
                problem, rng.choice(["rude", "answer"]), demo.wrong_answer(problem, rng)
            )
        answers = rng.sample([right, worse], 2)
        rewards = [demo.true_reward(text, answer) for answer in answers]
        better = "A" if rewards[0] > rewards[1] else "B"
        prompt = Prompt.objects.create(project=project, text=text, content_hash=content_hash(text))
        item = Item.objects.create(
            project=project,
            round=round_,
            prompt=prompt,
            is_gold=is_gold,
            gold_answer=better if is_gold else None,
        )
        for position, answer in enumerate(answers):
            candidate = Candidate.objects.create(
                prompt=prompt, text=answer, content_hash=content_hash(answer)
            )
            ItemCandidate.objects.create(item=item, candidate=candidate, position=position)
        truth[item.pk] = better
    return project, truth


LABEL_CHECKS = {"gold_accuracy", "stability", "consensus"}


# Simulated accounts are machine accounts: QC does not speed-check them (the server's clock
# cannot tell their pace, see test_qc_skips), so only their labels betray the bad actors.
# Always-left falls to the position test after 20 judgments. A random clicker needs a few
# gold answers, repeats or shared items: gold alone, at 25% of items, misses a 4-way random
# clicker (25% right) by its fourth check about once in a hundred projects (Wilson upper
# bound still >= 0.7; once in twenty-five by its third); by then it shares ~50 items with
# the others, and the consensus test catches what gold misses.
CAUGHT_BY = {"always_left": {"position_bias"}, "random": LABEL_CHECKS}
WITHIN = {"always_left": 40, "random": 80}


def test_qc_pauses_bad_actors_over_http_and_trust_weights_beat_majority(live_server):
    project, truth = _demo_project()
    kinds = ["careful", "noisy", "always_left", "random"]
    pool = {}
    for kind in kinds:
        token = annotation_services.simulated_annotator_ensure(
            project=project, username=f"sim-{kind}"
        )
        pool[kind] = (f"sim-{kind}", token, PRESETS[kind])
    user_ids = dict(
        Membership.objects.filter(project=project).values_list("user__username", "user_id")
    )

    def run_check_now(project_id, annotator_id):
        tasks.qc_check_annotator_task.apply(args=(project_id, annotator_id))

    # Label in batches; after each, call the hook as judgment_submit's on_commit would.
    for batch in range(MAX_BATCHES):
        active = [
            pool[kind]
            for kind in kinds
            if Membership.objects.get(project=project, user_id=user_ids[f"sim-{kind}"]).status
            == Membership.Status.ACTIVE
        ]
        stats = run_pool(
            base_url=live_server.url,
            project_id=project.pk,
            annotators=active,
            max_items=BATCH,
            seed=batch,
        )
        assert all(not s.errors for s in stats), [s.errors for s in stats]
        with mock.patch.object(tasks.qc_check_annotator_task, "delay", side_effect=run_check_now):
            for name, _, _ in active:
                services.qc_after_submit(project_id=project.pk, annotator_id=user_ids[name])
        if all(s.submitted < BATCH for s in stats):
            break  # everyone still active ran out of items

    def judgments_of(kind: str) -> int:
        return Judgment.objects.filter(annotator_id=user_ids[f"sim-{kind}"]).count()

    def membership(kind: str) -> Membership:
        return Membership.objects.get(project=project, user_id=user_ids[f"sim-{kind}"])

    # The bad actors are paused within the stated number of judgments, for a stated reason
    for kind, checks in CAUGHT_BY.items():
        assert membership(kind).status == Membership.Status.PAUSED, kind
        assert membership(kind).flagged
        assert judgments_of(kind) <= WITHIN[kind], kind
        pause = AnnotatorAssessment.objects.get(annotator_id=user_ids[f"sim-{kind}"], applied=True)
        assert set(pause.failed_checks) & checks, (kind, pause.reasons)
        # Their labels are kept, and every one of them is flagged
        flags = set(
            Judgment.objects.filter(annotator_id=user_ids[f"sim-{kind}"]).values_list(
                "qc_flag", flat=True
            )
        )
        assert len(flags) == 1 and flags.pop().startswith("paused:"), kind

    # The careful annotator labelled everything and was never paused
    assert membership("careful").status == Membership.Status.ACTIVE
    assert judgments_of("careful") >= N_ITEMS
    assert not AnnotatorAssessment.objects.filter(
        annotator_id=user_ids["sim-careful"], verdict="pause"
    ).exists()
    assert AnnotatorAssessment.objects.filter(annotator_id=user_ids["sim-careful"]).count() >= 3

    # Trust-weighted aggregation beats the majority on the same judgments
    votes = list(
        Judgment.objects.filter(project=project, item__is_gold=False, is_repeat=False).values_list(
            "item_id", "annotator_id", "choice"
        )
    )
    weights = selectors.annotator_trust_weights(project=project)

    def trust(kind: str) -> float:
        # A bad actor paused before its first gold answer has no entry: the default weight.
        return weights.get(user_ids[f"sim-{kind}"], selectors.DEFAULT_TRUST)

    assert trust("careful") > trust("always_left")
    assert trust("careful") > trust("random")
    primary_truth = {item: label for item, label in truth.items() if item in {v[0] for v in votes}}
    accuracy_majority = label_accuracy(majority_vote(votes), primary_truth)
    accuracy_weighted = label_accuracy(
        weighted_vote(votes, weights, default_weight=selectors.DEFAULT_TRUST), primary_truth
    )
    assert accuracy_weighted > accuracy_majority
    assert accuracy_weighted >= 0.9

    # Agreement is reported for the simulated source on its own, without the flagged labels
    report = selectors.project_agreement(project=project, n_boot=100)
    assert report["sources"] == ["simulated"]
    clean = Judgment.objects.filter(
        project=project, item__is_gold=False, is_repeat=False, qc_flag=""
    )
    assert report["by_source"]["simulated"]["n_judgments"] == clean.count()
    everything = selectors.project_agreement(project=project, n_boot=100, include_flagged=True)
    assert everything["by_source"]["simulated"]["n_judgments"] == len(votes)
    assert everything["by_source"]["simulated"]["alpha"]["estimate"] is not None
