"""Factories for tests: plain functions that build real rows."""

import itertools

from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from annotation.imports import content_hash
from annotation.models import Candidate, Item, ItemCandidate, Membership, Project, Prompt, Round

_seq = itertools.count(1)


def make_user(username: str | None = None, *, staff: bool = False, password: str = "pw"):
    username = username or f"user{next(_seq)}"
    user = get_user_model().objects.create_user(
        username=username, password=password, is_staff=staff, is_superuser=staff
    )
    return user


def make_project(**fields) -> Project:
    fields.setdefault("name", f"project {next(_seq)}")
    return Project.objects.create(**fields)


def add_member(project: Project, user, role: str = Membership.Role.ANNOTATOR) -> Membership:
    return Membership.objects.create(project=project, user=user, role=role)


def make_round(project: Project, number: int | None = None) -> Round:
    if number is None:
        number = Round.objects.filter(project=project).count() + 1
    return Round.objects.create(project=project, number=number)


def add_pool_prompts(project: Project, *, train: int, eval: int = 0) -> None:
    """Add `train` and `eval` arithmetic prompts to the project's prompt pool."""
    for split, count in (("train", train), ("eval", eval)):
        for i in range(count):
            text = f"What is {i % 10} + {(i + 3) % 10}? ({split} {i})"
            Prompt.objects.create(
                project=project,
                text=text,
                content_hash=content_hash(text),
                in_pool=True,
                split=split,
            )


def make_items(
    project: Project,
    n: int,
    *,
    round_: Round | None = None,
    gold: list | None = None,
    models: tuple[str, ...] | None = None,
) -> list[Item]:
    """Create n items of project.k candidates; `gold[i]` makes item i gold with that answer."""
    round_ = round_ or Round.objects.filter(project=project).first() or make_round(project)
    models = models or tuple(f"model-{j}" for j in range(project.k))
    items = []
    for i in range(n):
        serial = next(_seq)
        text = f"Prompt {serial}: question {i}?"
        prompt = Prompt.objects.create(project=project, text=text, content_hash=content_hash(text))
        answer = gold[i] if gold and i < len(gold) else None
        item = Item.objects.create(
            project=project,
            round=round_,
            prompt=prompt,
            is_gold=answer is not None,
            gold_answer=answer,
        )
        for j in range(project.k):
            ctext = f"answer {j} to {serial}"
            cand = Candidate.objects.create(
                prompt=prompt,
                text=ctext,
                content_hash=content_hash(ctext),
                model_name=models[j],
                checkpoint_id=f"ckpt-{models[j]}",
                generation_config={"temperature": 0.7, "seed": j},
            )
            ItemCandidate.objects.create(item=item, candidate=cand, position=j)
        items.append(item)
    return items


def make_tiny_demo_policy(folder, *, name: str, n_positions: int):
    """Register an untrained one-layer GPT-2 on a tokenizer of the demo domain's texts."""
    from training import demo
    from training.models import ModelVersion
    from training.trainers.tiny import build_tiny_causal_lm, train_tokenizer

    tokenizer = train_tokenizer(demo.tokenizer_training_texts(), vocab_size=300)
    path = build_tiny_causal_lm(
        tokenizer, folder, n_layer=1, n_embd=32, n_head=2, n_positions=n_positions
    )
    return ModelVersion.objects.create(name=name, artifact_path=str(path))


def token_client(user) -> APIClient:
    """An API client that authenticates as `user` with a new token, as a script would."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def submit_and_next(client, served: dict, n: int) -> dict | None:
    """Answer A to the `served` assignment asking for the next one in the same call (the
    annotator page's one round trip); return the next assignment served."""
    body = {"choice": "A", "idempotency_key": f"k{n}", "next": True}
    response = client.post(
        f"/api/assignments/{served['assignment_id']}/submit/", body, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()["next"]
