"""A worker SIGKILLed while it generates a round: the task comes back and the round is made once.

`training.loop_tasks.generate_round` (acks_late, reject_on_worker_lost) runs on a real
`celery worker` with a private redis-server as broker and a 10 s visibility timeout. The
worker is killed, with its pool process, while the round exists but its candidates are
still being sampled; a second worker gets the unacknowledged message again and generates
the round. Checked: one round for the key, K candidates per item, no item twice, no
candidate that belongs to no item (nothing half-written by the killed attempt), and a
third delivery of the same task changes nothing.

Killing a worker during training is covered by tests/training/test_celery_worker.py.
"""

from __future__ import annotations

import uuid

import pytest
from django.db.models import Count
from kombu import Connection

from annotation.models import Candidate, Item, ItemCandidate, Project, Round
from tests.factories import make_tiny_demo_policy
from tests.faults.support import CeleryWorker, RedisServer, wait_for
from training import loop
from training.loop_tasks import generate_round

pytestmark = [pytest.mark.slow, pytest.mark.celery, pytest.mark.django_db(transaction=True)]

VISIBILITY_TIMEOUT = 10
N_PROMPTS = 160  # enough sampling (several seconds) to be killed in the middle of it


@pytest.fixture
def tiny_policy(tmp_path):
    return make_tiny_demo_policy(tmp_path / "policy", name="tiny-policy", n_positions=96)


def _send(broker_url: str, queue: str, *args) -> None:
    options = {"visibility_timeout": VISIBILITY_TIMEOUT}
    with Connection(broker_url, transport_options=options) as broker:
        generate_round.apply_async(args=args, queue=queue, connection=broker)


def _round_state(project: Project, key: str) -> dict:
    round_ = Round.objects.filter(project=project, source_key=key).first()
    items = Item.objects.filter(round=round_) if round_ else Item.objects.none()
    return {
        "rounds": Round.objects.filter(project=project).count(),
        "items": items.count(),
        "slots": ItemCandidate.objects.filter(item__in=items).count(),
        "candidates": Candidate.objects.filter(prompt__project=project).count(),
        "prompts": sorted(items.values_list("prompt_id", flat=True)),
    }


def test_generation_killed_mid_round_is_redelivered_and_makes_the_round_once(tiny_policy, tmp_path):
    redis = RedisServer(tmp_path / "redis", durable=False)
    queue = f"gpu-faults-{uuid.uuid4().hex[:8]}"
    project = Project.objects.create(name="generation kill", overlap=1)
    settings = loop.LoopSettings(
        path="dpo",
        prompt_source="demo",
        n_prompts=N_PROMPTS,
        seed=5,
        mix_previous=False,
        generation={"temperature": 1.0, "max_new_tokens": 48, "batch_size": 8},
    ).to_dict()
    key = f"faults:{uuid.uuid4().hex[:8]}:gen"
    workers: list[CeleryWorker] = []

    def worker(name: str) -> CeleryWorker:
        workers.append(
            CeleryWorker(
                queue=queue,
                broker_url=redis.url,
                log_path=tmp_path / f"{name}.log",
                name=f"{name}-{queue}",
                visibility_timeout=VISIBILITY_TIMEOUT,
                extra_env={"OMP_NUM_THREADS": "1"},
            )
        )
        return workers[-1]

    try:
        # given a generation task picked up by a worker that has opened the round
        _send(redis.url, queue, project.pk, tiny_policy.pk, key, settings)
        first = worker("first")
        started = wait_for(
            lambda: Round.objects.filter(project=project, source_key=key).first(),
            timeout=180,
            interval=0.1,
            what="the first worker to open the round",
        )
        assert not started.items.exists(), "generation ended before the worker was killed"

        # when that worker and its pool process are SIGKILLed in the middle of sampling
        killed = first.kill()
        assert len(killed) >= 2 and all(not p.is_running() for p in killed)
        assert "generate_round" in first.text()
        at_kill = _round_state(project, key)
        assert at_kill["items"] == 0 and at_kill["candidates"] == 0, at_kill

        # then a second worker gets the unacknowledged message back and makes the round
        second = worker("second")
        wait_for(
            lambda: second.text().count("succeeded in") >= 1,
            timeout=300,
            interval=0.5,
            what="the redelivered task to succeed",
        )
        made = _round_state(project, key)
        assert made["rounds"] == 1
        assert 0 < made["items"] <= N_PROMPTS
        assert made["slots"] == made["items"] * project.k
        pairs = [
            (item.prompt_id, frozenset(item.slots.values_list("candidate_id", flat=True)))
            for item in Item.objects.filter(round__source_key=key)
        ]
        assert len(set(pairs)) == len(pairs)  # no item twice
        # every candidate belongs to an item: the killed attempt left nothing behind
        assert made["candidates"] == made["slots"]
        per_item = (
            ItemCandidate.objects.filter(item__round__source_key=key)
            .values("item_id")
            .annotate(n=Count("candidate_id", distinct=True))
        )
        assert {row["n"] for row in per_item} == {project.k}

        # and delivering the task once more changes nothing
        _send(redis.url, queue, project.pk, tiny_policy.pk, key, settings)
        wait_for(
            lambda: second.text().count("succeeded in") >= 2,
            timeout=120,
            what="the duplicate task to be handled",
        )
        assert _round_state(project, key) == made
    finally:
        for w in workers:
            w.stop()
        redis.stop()
