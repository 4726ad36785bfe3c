"""Prompts of the next round: fresh ones, mixed with hard examples mined from the last round.

Each mining strategy ranks a round's prompts hardest first and is registered under the mode
name a project's loop settings give (`hard_mining`), with the number of reward models it
needs (newest first).
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from typing import TYPE_CHECKING, Any

from django.db.models import Count, Exists, OuterRef, Prefetch, Q

from annotation.models import Item, ItemCandidate, Judgment, Project, Prompt, Round
from annotation.prompt_pool import PromptPayload, prompt_payload, prompt_pool_draw
from training.models import ModelVersion

if TYPE_CHECKING:
    from training.loop.settings import LoopSettings

logger = logging.getLogger(__name__)

Ranker = Callable[[Round, list[ModelVersion]], list[Prompt]]


@dataclass(frozen=True)
class MiningStrategy:
    """A way to rank a round's prompts hardest first, and the reward models it needs."""

    rank: Ranker
    reward_models: int


MINING_STRATEGIES: dict[str, MiningStrategy] = {}


def mining_strategy(mode: str, *, reward_models: int = 0) -> Callable[[Ranker], Ranker]:
    """Register a ranker under the `hard_mining` mode name `mode`."""

    def register(rank: Ranker) -> Ranker:
        MINING_STRATEGIES[mode] = MiningStrategy(rank=rank, reward_models=reward_models)
        return rank

    return register


def reward_models_newest(*, project: Project, limit: int = 2) -> list[ModelVersion]:
    """Return the project's newest reward models (trained in its runs), newest first."""
    return list(
        ModelVersion.objects.filter(kind=ModelVersion.Kind.REWARD, training_run__project=project)
        .select_related("dataset_version", "training_run__dataset_version")
        .order_by("-created_at", "-id")[:limit]
    )


def prompts_select(
    *,
    project: Project,
    settings: LoopSettings,
    reward_models: list[ModelVersion] | None = None,
) -> list[PromptPayload]:
    """Return the prompts of the next round: fresh ones, optionally mixed with hard examples.

    With `settings.hard_mining`, `round(n * (1 - random_share))` of the n prompts are hard
    examples of the newest round with items (see `_hard_prompts`) and the rest are fresh
    prompts drawn at random, so the data keeps its natural mix; when fewer hard prompts
    exist, fresh ones fill the round. No fresh prompt repeats a hard one.

    `reward_models` are the reward models to mine with, newest first; when not given they are
    looked up in the project. A prompt is its text, or its chat messages for a chat prompt.
    """
    rng = random.Random(settings.seed + Round.objects.filter(project=project).count())
    n = settings.n_prompts
    n_hard = round(n * (1 - settings.random_share)) if settings.hard_mining else 0
    n_hard = max(0, min(n, n_hard))
    hard = _hard_prompts(project=project, settings=settings, n=n_hard, reward_models=reward_models)
    # Ask for n fresh prompts: those equal to a hard one are dropped, the rest still fill n.
    fresh = _fresh_prompts(project=project, settings=settings, n=n, rng=rng)
    taken = {_prompt_key(p) for p in hard}
    return (hard + [p for p in fresh if _prompt_key(p) not in taken])[:n]


def _prompt_key(prompt: PromptPayload) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def _fresh_prompts(*, project: Project, settings: LoopSettings, n: int, rng) -> list[PromptPayload]:
    """Return n fresh prompts: demo prompts, or the pool's train split, least used first.

    The pool's evaluation split is never drawn here: no training round uses it.
    """
    if settings.prompt_source == "demo":
        from training import demo

        used = Round.objects.filter(project=project).count()
        return demo.generate_prompts(n, seed=settings.seed * 1000 + used, split="train")
    drawn = prompt_pool_draw(
        project=project, n=n, split=Prompt.Split.TRAIN, seed=rng.randrange(2**31)
    )
    return [prompt_payload(p) for p in drawn]


def _hard_prompts(
    *,
    project: Project,
    settings: LoopSettings,
    n: int,
    reward_models: list[ModelVersion] | None = None,
) -> list[PromptPayload]:
    """Return up to n distinct prompt texts of the newest round with items, hardest first.

    Modes (`settings.hard_mining`), over the round's non-gold items:

    disagreement     counted votes (primary, unflagged, human) split between A and B, most
                     even split first.
    rm_margin        smallest gap between the newest reward model's best and worst score of
                     an item's candidates first.
    rm_disagreement  the two newest reward models order the item's candidate pairs
                     differently: largest share of such pairs first, then the smaller mean
                     combined margin (|diff| under each model). Needs two reward models.
    human_rm         the human majority (pairwise A/B votes; ranking: best mean rank) against
                     the newest reward model: items whose preferred answer the model scores
                     below another come first, by human vote share (high first), then by
                     how far the model prefers the other answer (far first); then the items it
                     agrees on, by its margin (small first). Ties of human votes are skipped.

    A mode whose reward models are missing returns no prompts (the round is all fresh).
    """
    if n <= 0 or not settings.hard_mining:
        return []
    mode = settings.hard_mining
    if mode not in MINING_STRATEGIES:
        logger.warning("unknown hard_mining mode %r: no hard prompts", mode)
        return []
    round_ = (
        Round.objects.filter(project=project, purpose=Round.Purpose.TRAIN)
        .filter(Exists(Item.objects.filter(round=OuterRef("pk"), is_gold=False)))
        .order_by("-number")
        .first()
    )
    if round_ is None:
        # The round being generated may already exist, still empty: it is skipped above.
        return []
    strategy = MINING_STRATEGIES[mode]
    if strategy.reward_models:
        if reward_models is None:
            reward_models = reward_models_newest(project=project)
        if len(reward_models) < strategy.reward_models:
            logger.info("hard_mining %r: no reward model to mine with, fresh prompts only", mode)
            return []
    return _distinct_texts(strategy.rank(round_, list(reward_models or [])))[:n]


def _distinct_texts(prompts: list[Prompt]) -> list[PromptPayload]:
    """Return the prompts (texts, or messages of chat prompts) in order, without repeats."""
    payloads: list[PromptPayload] = []
    seen: set[str] = set()
    for prompt in prompts:
        payload = prompt_payload(prompt)
        key = _prompt_key(payload)
        if payload and key not in seen:
            seen.add(key)
            payloads.append(payload)
    return payloads


def _round_items(round_: Round) -> list[Item]:
    """Return the round's non-gold items with their prompt and candidates (by position)."""
    slots = ItemCandidate.objects.select_related("candidate").order_by("position")
    return list(
        Item.objects.filter(round=round_, is_gold=False)
        .select_related("prompt")
        .prefetch_related(Prefetch("slots", queryset=slots))
        .order_by("id")
    )


def reward_model_trained_on_chat(model: ModelVersion) -> bool:
    """Return whether the reward model was trained on conversational rows."""
    dataset = model.dataset_version
    if dataset is None and model.training_run is not None:
        dataset = model.training_run.dataset_version
    return bool(dataset is not None and dataset.report.get("conversational"))


def _candidate_scores(model: ModelVersion, item: Item, *, chat: bool) -> list[float]:
    """Return the reward model's score of each of the item's candidates, by position."""
    from training.scoring import reward_scores

    prompt = item.prompt
    if prompt.messages:
        scored_prompt: Any = prompt.messages
    elif chat:
        # The loop exports conversational rows: a text prompt was trained as one user turn.
        scored_prompt = [{"role": "user", "content": prompt.text}]
    else:
        scored_prompt = prompt.text
    answers = [slot.candidate.text for slot in item.slots.all()]
    return reward_scores(model.artifact_path, scored_prompt, answers)


def _sign(value: float) -> int:
    return (value > 0) - (value < 0)


@mining_strategy("disagreement")
def rank_by_vote_split(round_: Round, reward_models: list[ModelVersion]) -> list[Prompt]:
    """Rank items split by counted votes between A and B, the most even split first."""
    split = []
    counted = Judgment.objects.filter(item__round=round_).counted().values("pk")
    items = (
        Item.objects.filter(round=round_, is_gold=False)
        .annotate(
            a=Count("judgments", filter=Q(judgments__choice="A", judgments__in=counted)),
            b=Count("judgments", filter=Q(judgments__choice="B", judgments__in=counted)),
        )
        .filter(a__gt=0, b__gt=0)
        .select_related("prompt")
    )
    for item in items:
        split.append((-min(item.a, item.b) / (item.a + item.b), item.prompt.text, item.prompt))
    return [prompt for *_, prompt in sorted(split, key=lambda row: row[:2])]


@mining_strategy("rm_margin", reward_models=1)
def rank_by_rm_margin(round_: Round, reward_models: list[ModelVersion]) -> list[Prompt]:
    """Rank items by the newest reward model's best-minus-worst score, smallest first."""
    model = reward_models[0]
    chat = reward_model_trained_on_chat(model)
    ranked = []
    for item in _round_items(round_):
        scores = _candidate_scores(model, item, chat=chat)
        if len(scores) >= 2:
            ranked.append((max(scores) - min(scores), item.pk, item.prompt))
    return [prompt for *_, prompt in sorted(ranked, key=lambda row: row[:2])]


@mining_strategy("rm_disagreement", reward_models=2)
def rank_by_rm_disagreement(round_: Round, reward_models: list[ModelVersion]) -> list[Prompt]:
    """Rank items by the share of candidate pairs the two newest reward models order apart."""
    newer, older = reward_models[0], reward_models[1]
    chat_newer, chat_older = (
        reward_model_trained_on_chat(newer),
        reward_model_trained_on_chat(older),
    )
    ranked = []
    for item in _round_items(round_):
        first = _candidate_scores(newer, item, chat=chat_newer)
        second = _candidate_scores(older, item, chat=chat_older)
        pairs = list(combinations(range(len(first)), 2))
        if not pairs:
            continue
        disagree, margin = 0, 0.0
        for i, j in pairs:
            diff_first, diff_second = first[i] - first[j], second[i] - second[j]
            disagree += _sign(diff_first) != _sign(diff_second)
            margin += abs(diff_first) + abs(diff_second)
        ranked.append((-disagree / len(pairs), margin / len(pairs), item.pk, item.prompt))
    return [prompt for *_, prompt in sorted(ranked, key=lambda row: row[:3])]


def _human_preference(votes: dict[str, int], rankings: list[list[int]], k: int):
    """Return (position the humans prefer, its vote share), or None without a clear one."""
    a, b = votes.get("A", 0), votes.get("B", 0)
    if k == 2 and a + b:
        if a == b:
            return None
        return (0 if a > b else 1), max(a, b) / (a + b)
    rankings = [r for r in rankings if isinstance(r, list) and len(r) == k]
    if not rankings:
        return None
    mean_rank = [sum(r[pos] for r in rankings) / len(rankings) for pos in range(k)]
    best = min(mean_rank)
    if mean_rank.count(best) > 1:
        return None
    top = mean_rank.index(best)
    return top, sum(r[top] == 1 for r in rankings) / len(rankings)


@mining_strategy("human_rm", reward_models=1)
def rank_by_human_rm(round_: Round, reward_models: list[ModelVersion]) -> list[Prompt]:
    """Rank items where the newest reward model goes against the human majority first."""
    model = reward_models[0]
    items = _round_items(round_)
    votes: dict[int, dict[str, int]] = {}
    rankings: dict[int, list[list[int]]] = {}
    judgments = (
        Judgment.objects.filter(item__in=[item.pk for item in items])
        .counted()
        .values_list("item_id", "choice", "ranking")
    )
    for item_id, choice, ranking in judgments:
        if choice in ("A", "B"):
            per_item = votes.setdefault(item_id, {})
            per_item[choice] = per_item.get(choice, 0) + 1
        elif ranking:
            rankings.setdefault(item_id, []).append(ranking)
    chat = reward_model_trained_on_chat(model)
    ranked = []
    for item in items:
        k = len(item.slots.all())
        preference = _human_preference(votes.get(item.pk, {}), rankings.get(item.pk, []), k)
        if preference is None:
            continue
        top, share = preference
        scores = _candidate_scores(model, item, chat=chat)
        # Signed margin: how far the model scores the humans' choice above its best rival.
        margin = scores[top] - max(s for pos, s in enumerate(scores) if pos != top)
        if margin < 0:
            ranked.append(((0, -share, margin, item.pk), item.prompt))
        else:
            ranked.append(((1, margin, share, item.pk), item.prompt))
    return [prompt for _, prompt in sorted(ranked, key=lambda row: row[0])]


# Every mode a project's loop settings may name ('' mines nothing).
HARD_MINING_MODES = ("", *MINING_STRATEGIES)
