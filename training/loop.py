"""Close the loop: export -> train -> evaluate -> generate -> open the next round.

An iteration is keyed by the round it learns from (`loop-<project>-r<number>`), and each of
its steps leaves a row that the next call finds instead of redoing the work:

    export    DatasetVersion named by the key
    train     TrainingRun(s) on that dataset version (DPO, or reward model then PPO)
    evaluate  eval_results on the new policy's ModelVersion
    generate  the next Round, created with source_key "<key>:gen"

`loop_advance` moves an iteration as far as it can and returns what it did. Run with
`sync=True` it trains and generates in-process; otherwise it queues the slow steps on the
`gpu` queue and returns, and the next tick (django-celery-beat) picks up from there, so a
failed step can be retried alone and a researcher can pause the schedule.
"""

from __future__ import annotations

import io
import json
import logging
import random
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

from django.db import transaction
from django.db.models import Count, Exists, OuterRef, Prefetch, Q

from annotation import services as annotation_services
from annotation.importers import ImportFailed, items_import, normalise
from annotation.models import (
    Item,
    ItemCandidate,
    Judgment,
    LabelSource,
    Project,
    Prompt,
    Round,
)
from training.generation import GenerationSettings, generate_candidates
from training.models import ModelVersion, TrainingRun

logger = logging.getLogger(__name__)
LOOP_TASK = "training.loop_tasks.loop_tick"


HARD_MINING_MODES = ("", "disagreement", "rm_margin", "rm_disagreement", "human_rm")


@dataclass
class LoopSettings:
    """A project's loop policy (stored as the kwargs of its beat schedule)."""

    path: str = field(default="dpo", metadata={"help": "'dpo' or 'rm_ppo'."})
    n_prompts: int = field(default=256, metadata={"help": "Prompts per new round."})
    k: int = field(default=2, metadata={"help": "Candidates per prompt (project's k)."})
    prompt_source: str = field(
        default="demo", metadata={"help": "'demo' (generated demo prompts) or 'pool' (project)."}
    )
    hard_mining: str = field(
        default="",
        metadata={
            "help": "Hard-example mining: '' (none) | 'disagreement' (split labels) | "
            "'rm_margin' (small reward-model margin) | 'rm_disagreement' (the two newest "
            "reward models order answers differently) | 'human_rm' (humans vs the newest "
            "reward model)."
        },
    )
    random_share: float = field(
        default=0.5, metadata={"help": "Share of prompts always drawn at random when mining."}
    )
    mix_previous: bool = field(
        default=True, metadata={"help": "Pair the new policy's answers with the previous one's."}
    )
    min_new_judgments: int = field(
        default=0,
        metadata={
            "help": "Start an iteration once this many labels arrived (0: when "
            "the round is complete)."
        },
    )
    sources: list[str] = field(
        default_factory=lambda: [LabelSource.HUMAN, LabelSource.SIMULATED],
        metadata={"help": "Label sources trained on (named explicitly, never mixed silently)."},
    )
    aggregation: str = field(default="majority", metadata={"help": "Export aggregation policy."})
    seed: int = field(default=0, metadata={"help": "Seed of prompt choice and generation."})
    generation: dict = field(
        default_factory=lambda: {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 24},
        metadata={"help": "GenerationSettings fields."},
    )
    dpo: dict = field(default_factory=dict, metadata={"help": "DPO recipe overrides."})
    reward: dict = field(default_factory=dict, metadata={"help": "Reward recipe overrides."})
    ppo: dict = field(default_factory=dict, metadata={"help": "PPO recipe overrides."})

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> LoopSettings:
        """Build settings from a dict, rejecting unknown keys."""
        values = dict(values or {})
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown loop setting(s): {', '.join(sorted(unknown))}")
        settings = cls(**values)
        if settings.path not in ("dpo", "rm_ppo"):
            raise ValueError("path must be 'dpo' or 'rm_ppo'")
        if settings.hard_mining not in HARD_MINING_MODES:
            modes = ", ".join(repr(m) for m in HARD_MINING_MODES)
            raise ValueError(f"hard_mining must be one of {modes}")
        if not 0.0 <= settings.random_share <= 1.0:
            raise ValueError("random_share must be between 0 and 1")
        return settings

    def to_dict(self) -> dict:
        return asdict(self)


# Tuned on the demo domain's ~0.13M-parameter policy (benchmarks/loop_bench.py): at the TRL
# default lr (1e-6) or 5e-5 such a model does not move measurably; lr 2e-4 with beta 0.3
# drops rude answers without the likelihood collapse (both log-probs falling, garbled
# answers) that lr 5e-4 / beta 0.1 showed.
DPO_DEFAULTS = {
    "learning_rate": 2e-4,
    "beta": 0.3,
    "num_train_epochs": 3,
    "per_device_train_batch_size": 16,
    "max_length": 64,
    "save_steps": 200,
    "logging_steps": 10,
}
REWARD_DEFAULTS = {
    "learning_rate": 1e-3,
    "num_train_epochs": 3,
    "per_device_train_batch_size": 16,
    "max_length": 64,
    "save_steps": 200,
    "logging_steps": 10,
}
# Tiny-model PPO (benchmarks/loop_bench.py): lr ~1e-4, a faster critic, 30 updates a round.
# The demo's reward model learns style, not arithmetic (correct-vs-wrong pairs at chance, the
# score of one answer with different numbers varies by ~0.005), so once answers are polite
# there is nothing left to learn. Raw scores and unwhitened advantages keep those rounds'
# updates as small as their signal; standardising either blew the noise up to full-size
# steps that eroded accuracy round after round (held-out 0.25 -> 0.12 with a standardised
# score; 0.29 -> 0.20 with whitened advantages, round-3 gain +0.17 to +0.21 vs +0.26 to +0.33).
PPO_DEFAULTS: dict[str, Any] = {
    "learning_rate": 1e-4,
    "value_learning_rate": 1e-3,
    "max_steps": 30,
    "rollout_batch_size": 64,
    "per_device_train_batch_size": 16,
    "kl_coef": 0.1,
    "target_kl": 1.5,
    "kl_horizon": 300,
    "normalize_score": False,
    "whiten_advantages": False,
    "max_new_tokens": 24,
    "max_length": 64,
    "save_steps": 200,
    "logging_steps": 5,
}


@dataclass
class Step:
    name: str
    status: str  # done | started | waiting | failed | skipped
    detail: str = ""


@dataclass
class LoopState:
    key: str
    steps: list[Step] = field(default_factory=list)
    new_round: Round | None = None

    def add(self, name: str, status: str, detail: str = "") -> None:
        self.steps.append(Step(name, status, detail))
        logger.info("loop %s: %s %s %s", self.key, name, status, detail)


def loop_key(round_: Round) -> str:
    return f"loop-{round_.project_id}-r{round_.number}"


# --------------------------------------------------------------------------- prompts


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
) -> list[str]:
    """Return the prompts of the next round: fresh ones, optionally mixed with hard examples.

    With `settings.hard_mining`, `round(n * (1 - random_share))` of the n prompts are hard
    examples of the newest round with items (seed 004 §4.4, see `_hard_prompts`) and the rest are
    fresh prompts drawn at random, so the data keeps its natural mix; when fewer hard prompts
    exist, fresh ones fill the round. No fresh prompt repeats a hard one.

    `reward_models` are the reward models to mine with, newest first; when not given they are
    looked up in the project.
    """
    rng = random.Random(settings.seed + Round.objects.filter(project=project).count())
    n = settings.n_prompts
    n_hard = round(n * (1 - settings.random_share)) if settings.hard_mining else 0
    n_hard = max(0, min(n, n_hard))
    hard = _hard_prompts(project=project, settings=settings, n=n_hard, reward_models=reward_models)
    # Ask for n fresh prompts: those equal to a hard one are dropped, the rest still fill n.
    fresh = _fresh_prompts(project=project, settings=settings, n=n, rng=rng)
    taken = set(hard)
    return (hard + [p for p in fresh if p not in taken])[:n]


def _fresh_prompts(*, project: Project, settings: LoopSettings, n: int, rng) -> list[str]:
    if settings.prompt_source == "demo":
        from training import demo

        used = Round.objects.filter(project=project).count()
        return demo.generate_prompts(n, seed=settings.seed * 1000 + used, split="train")
    texts = list(
        project.prompts.annotate(n_items=Count("items"))
        .order_by("n_items", "id")
        .values_list("text", flat=True)[: n * 3]
    )
    rng.shuffle(texts)
    return [t for t in texts if t][:n]


def _hard_prompts(
    *,
    project: Project,
    settings: LoopSettings,
    n: int,
    reward_models: list[ModelVersion] | None = None,
) -> list[str]:
    """Return up to n distinct prompt texts of the newest round with items, hardest first.

    Modes (`settings.hard_mining`), over the round's non-gold items:

    disagreement     human and other labels split between A and B, most even split first.
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
    if mode not in HARD_MINING_MODES:
        logger.warning("unknown hard_mining mode %r: no hard prompts", mode)
        return []
    round_ = (
        Round.objects.filter(project=project)
        .filter(Exists(Item.objects.filter(round=OuterRef("pk"), is_gold=False)))
        .order_by("-number")
        .first()
    )
    if round_ is None:
        # The round being generated may already exist, still empty: it is skipped above.
        return []
    if mode == "disagreement":
        return _distinct_texts(_rank_by_vote_split(round_))[:n]
    if reward_models is None:
        reward_models = reward_models_newest(project=project)
    if mode == "rm_margin" and reward_models:
        ranked = _rank_by_rm_margin(round_, reward_models[0])
    elif mode == "rm_disagreement" and len(reward_models) >= 2:
        ranked = _rank_by_rm_disagreement(round_, reward_models[0], reward_models[1])
    elif mode == "human_rm" and reward_models:
        ranked = _rank_by_human_rm(round_, reward_models[0])
    else:
        logger.info("hard_mining %r: no reward model to mine with, fresh prompts only", mode)
        return []
    return _distinct_texts(ranked)[:n]


def _distinct_texts(prompts: list[Prompt]) -> list[str]:
    """Return the prompts' texts in order, without blanks or repeats."""
    texts: list[str] = []
    seen: set[str] = set()
    for prompt in prompts:
        if prompt.text and prompt.text not in seen:
            seen.add(prompt.text)
            texts.append(prompt.text)
    return texts


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


def _rank_by_vote_split(round_: Round) -> list[Prompt]:
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


def _rank_by_rm_margin(round_: Round, model: ModelVersion) -> list[Prompt]:
    chat = reward_model_trained_on_chat(model)
    ranked = []
    for item in _round_items(round_):
        scores = _candidate_scores(model, item, chat=chat)
        if len(scores) >= 2:
            ranked.append((max(scores) - min(scores), item.pk, item.prompt))
    return [prompt for *_, prompt in sorted(ranked, key=lambda row: row[:2])]


def _rank_by_rm_disagreement(
    round_: Round, newer: ModelVersion, older: ModelVersion
) -> list[Prompt]:
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


def _rank_by_human_rm(round_: Round, model: ModelVersion) -> list[Prompt]:
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


# --------------------------------------------------------------------------- generate


def round_generate(
    *,
    project: Project,
    model_version: ModelVersion,
    prompts: list[str],
    settings: LoopSettings,
    mix_with: ModelVersion | None = None,
    source_key: str,
) -> Round:
    """Open a round of K candidates per prompt from a policy; a repeated call returns it.

    With `mix_with`, one of the K candidates comes from that (e.g. previous) version, so the
    comparisons span versions. Prompts whose K answers are not all distinct are left out.
    """
    round_ = annotation_services.round_create(
        project=project, model_version=model_version, source_key=source_key
    )
    if round_.items.exists():
        return round_
    gen = GenerationSettings(**{**settings.generation, "seed": settings.seed})
    k = project.k
    from_new = k - 1 if (mix_with is not None and k > 1) else k
    # Oversample so that duplicates can be dropped and K distinct answers remain.
    new = generate_candidates(
        model_version.artifact_path,
        prompts,
        k=from_new * 2,
        settings=gen,
        model_name=model_version.name,
    )
    old = (
        generate_candidates(
            mix_with.artifact_path, prompts, k=2, settings=gen, model_name=mix_with.name
        )
        if from_new < k
        else [[] for _ in prompts]
    )
    rows = []
    for prompt, new_c, old_c in zip(prompts, new, old, strict=True):
        picked, seen = [], set()
        for cand in old_c[: k - from_new] + new_c:
            key = normalise(cand["text"])
            if not key or key in seen:
                continue
            if cand in old_c and len([c for c in picked if c in old_c]) >= k - from_new:
                continue
            if cand in new_c and len([c for c in picked if c in new_c]) >= from_new:
                continue
            seen.add(key)
            picked.append(cand)
        if len(picked) == k:
            rows.append({"prompt": prompt, "candidates": picked})
    with transaction.atomic():
        Round.objects.select_for_update().filter(pk=round_.pk).first()
        if round_.items.exists():
            return round_
        while rows:
            try:
                items_import(
                    project=project,
                    stream=io.StringIO("\n".join(json.dumps(r) for r in rows)),
                    round_=round_,
                )
                break
            except ImportFailed as exc:
                # Leave out the prompts the importer refuses (e.g. a pair already asked).
                bad = {line for line, _ in exc.errors if line > 0}
                if not bad:
                    raise
                logger.warning(
                    "round %s: leaving out %d prompt(s) the importer refused (%s); "
                    "importing the others",
                    round_.number,
                    len(bad),
                    "; ".join(f"line {line}: {error}" for line, error in exc.errors[:3]),
                )
                rows = [row for i, row in enumerate(rows, start=1) if i not in bad]
    logger.info(
        "round %s: %d of %d prompts had %d distinct answers",
        round_.number,
        len(rows),
        len(prompts),
        k,
    )
    return round_


# --------------------------------------------------------------------------- iteration


def _labels_in(round_: Round, sources: list[str]) -> int:
    return Judgment.objects.filter(item__round=round_).primary().of_sources(sources).count()


def loop_ready(*, project: Project, settings: LoopSettings) -> Round | None:
    """Return the open round an iteration can learn from now, or None."""
    round_ = Round.objects.filter(project=project).order_by("-number").first()
    if round_ is None or round_.model_version_id is None:
        return None
    labels = _labels_in(round_, settings.sources)
    if settings.min_new_judgments:
        return round_ if labels >= settings.min_new_judgments else None
    needed = round_.items.filter(is_gold=False).count() * project.overlap
    return round_ if needed and labels >= needed else None


def _dataset(round_: Round, settings: LoopSettings, key: str):
    from annotation.models import DatasetVersion

    versions = DatasetVersion.objects.filter(project=round_.project, name=key)
    existing = versions.exclude(status="failed").order_by("-version").first()
    if existing is not None and existing.status == "ready":
        return existing, "done"
    failed = versions.filter(status="failed").order_by("-version").first()
    if existing is None and failed is not None:
        newer = Judgment.objects.filter(item__round=round_, created_at__gt=failed.created_at)
        if not newer.exists():
            # Rebuilding the same labels would fail the same way: wait for new labels.
            return failed, "failed"
    from annotation.exports import dataset_version_build, dataset_version_create

    if existing is None:
        rounds = list(
            Round.objects.filter(project=round_.project, number__lte=round_.number).values_list(
                "number", flat=True
            )
        )
        existing = dataset_version_create(
            project=round_.project,
            name=key,
            policy={
                "format": "trl",
                # Candidates were sampled through the chat template (generate_candidates), so
                # train on chat rows too: plain-text rows skip the template in DPO/RM/PPO.
                "conversational": True,
                "aggregation": settings.aggregation,
                "sources": settings.sources,
                "ties": "drop",
                "both_bad": "drop",
                "rounds": rounds,
                "split": {"train": 0.9, "validation": 0.1, "test": 0.0},
                "seed": settings.seed,
                "hf": False,
            },
        )
    from annotation.services import ServiceError

    try:
        version = dataset_version_build(dataset_version_id=existing.pk)
    except ServiceError:
        existing.refresh_from_db()
        return existing, "failed"
    return version, "started"


def _run_for(project, dataset_version, recipe: str) -> TrainingRun | None:
    return (
        TrainingRun.objects.filter(project=project, dataset_version=dataset_version, recipe=recipe)
        .exclude(status__in=[TrainingRun.Status.FAILED, TrainingRun.Status.CANCELLED])
        .order_by("-id")
        .first()
    )


def _train(
    *,
    recipe: str,
    config: dict,
    project,
    dataset_version,
    base_model,
    sync: bool,
    state,
) -> TrainingRun | None:
    """Return the iteration's finished run of `recipe`, creating or running it if needed."""
    from training import services as training_services
    from training import supervisor as training_supervisor

    run = _run_for(project, dataset_version, recipe)
    if run is None:
        failed = (
            TrainingRun.objects.filter(
                project=project,
                dataset_version=dataset_version,
                recipe=recipe,
                status=TrainingRun.Status.FAILED,
            )
            .order_by("-id")
            .first()
        )
        if failed is not None and not sync:
            state.add(recipe, "failed", f"run {failed.pk}: {failed.error[-300:]}")
            return None
        run = training_services.training_run_create(
            recipe=recipe,
            config=config,
            dataset_version=dataset_version,
            base_model=base_model,
            project=project,
            enqueue=not sync,
        )
    if run.status == TrainingRun.Status.SUCCEEDED:
        state.add(recipe, "done", f"run {run.pk}")
        return run
    if sync:
        run = training_supervisor.training_run_execute(run_id=run.pk)
        if run is None or run.status != TrainingRun.Status.SUCCEEDED:
            error = run.error[-500:] if run else "run vanished"
            state.add(recipe, "failed", f"run {run.pk if run else '?'}: {error}")
            return None
        state.add(recipe, "done", f"run {run.pk}")
        return run
    state.add(recipe, "waiting", f"run {run.pk} is {run.status}")
    return None


def loop_advance(
    *, project: Project, settings: LoopSettings, sync: bool = False, force: bool = False
) -> LoopState:
    """Move the project's current iteration as far as it can go; return the steps taken."""
    round_ = Round.objects.filter(project=project).order_by("-number").first()
    if round_ is None:
        return LoopState(key="-", steps=[Step("start", "skipped", "no round yet")])
    key = loop_key(round_)
    state = LoopState(key=key)
    if round_.source_key.endswith(":gen") and not round_.items.exists():
        # A previous iteration opened this round but its generation did not finish.
        previous = Round.objects.filter(project=project, number=round_.number - 1).first()
        if previous is not None:
            return _generate_step(project, previous, round_.model_version, settings, state, sync)
    if not force and loop_ready(project=project, settings=settings) is None:
        state.add("wait", "waiting", f"round {round_.number} needs more labels")
        return state
    if round_.model_version_id is None:
        state.add("start", "skipped", f"round {round_.number} has no policy version")
        return state
    parent = round_.model_version

    dataset, status = _dataset(round_, settings, key)
    if status == "failed":
        state.add("export", "failed", f"dataset v{dataset.version}: {dataset.error[-300:]}")
        return state
    state.add("export", status, f"dataset v{dataset.version} {dataset.split_counts}")
    if dataset.status != "ready":
        state.add("export", "waiting", dataset.status)
        return state

    if settings.path == "dpo":
        config = {**DPO_DEFAULTS, **settings.dpo, "seed": settings.seed}
        run = _train(
            recipe="dpo",
            config=config,
            project=project,
            dataset_version=dataset,
            base_model=parent,
            sync=sync,
            state=state,
        )
    else:
        rm_config = {
            **REWARD_DEFAULTS,
            **settings.reward,
            "seed": settings.seed,
            "model_name_or_path": settings.reward.get("model_name_or_path") or parent.artifact_path,
        }
        rm_run = _train(
            recipe="reward",
            config=rm_config,
            project=project,
            dataset_version=dataset,
            base_model=None,
            sync=sync,
            state=state,
        )
        if rm_run is None:
            return state
        reward_path = rm_run.model_version.artifact_path
        ppo_config = {
            **PPO_DEFAULTS,
            **settings.ppo,
            "seed": settings.seed,
            "reward_model_path": reward_path,
        }
        run = _train(
            recipe="ppo",
            config=ppo_config,
            project=project,
            dataset_version=dataset,
            base_model=parent,
            sync=sync,
            state=state,
        )
    if run is None:
        return state
    policy = ModelVersion.objects.get(training_run=run)
    _evaluate_step(policy, state)
    annotation_services.round_close(round_=round_)
    return _generate_step(project, round_, policy, settings, state, sync)


def _evaluate_step(policy: ModelVersion, state: LoopState) -> None:
    if "true_reward" in policy.eval_results:
        state.add("evaluate", "done", f"true reward {policy.eval_results['true_reward']:.3f}")
        return
    try:
        from training.demo_eval import policy_true_reward

        result = policy_true_reward(policy.artifact_path)
    except ValueError as exc:  # not the demo domain: the reward model metrics stand
        state.add("evaluate", "skipped", str(exc)[:200])
        return
    policy.eval_results = {**policy.eval_results, **result}
    policy.save(update_fields=["eval_results"])
    low, high = result["true_reward_ci95"]
    state.add(
        "evaluate", "done", f"true reward {result['true_reward']:.3f} [{low:.3f}, {high:.3f}]"
    )


def _generate_step(project, learned_from: Round, policy, settings, state, sync) -> LoopState:
    key = f"{loop_key(learned_from)}:gen"
    if not sync:
        existing = Round.objects.filter(project=project, source_key=key).first()
        if existing is not None and existing.items.exists():
            state.new_round = existing
            state.add("generate", "done", f"round {existing.number}")
            return state
        from training.loop_tasks import generate_round

        annotation_services.round_create(project=project, model_version=policy, source_key=key)
        transaction.on_commit(
            lambda: generate_round.delay(project.pk, policy.pk, key, settings.to_dict())
        )
        state.add("generate", "started", key)
        return state
    round_ = generate_round_now(
        project_id=project.pk,
        model_version_id=policy.pk,
        source_key=key,
        settings=settings.to_dict(),
    )
    state.new_round = round_
    state.add("generate", "done", f"round {round_.number}: {round_.items.count()} items")
    return state


def generate_round_now(
    *, project_id: int, model_version_id: int, source_key: str, settings: dict
) -> Round:
    """Choose prompts and generate the round keyed by source_key (idempotent)."""
    project = Project.objects.get(pk=project_id)
    policy = ModelVersion.objects.get(pk=model_version_id)
    loop_settings = LoopSettings.from_dict(settings)
    prompts = prompts_select(
        project=project,
        settings=loop_settings,
        reward_models=reward_models_newest(project=project),
    )
    return round_generate(
        project=project,
        model_version=policy,
        prompts=prompts,
        settings=loop_settings,
        mix_with=policy.parent if loop_settings.mix_previous else None,
        source_key=source_key,
    )


# --------------------------------------------------------------------------- schedule


def loop_schedule_set(
    *, project: Project, settings: LoopSettings, every_seconds: int = 60, enabled: bool = True
):
    """Create or update the project's beat schedule that ticks its loop."""
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    interval, _ = IntervalSchedule.objects.get_or_create(
        every=every_seconds, period=IntervalSchedule.SECONDS
    )
    task, _ = PeriodicTask.objects.update_or_create(
        name=f"prefloop-loop-{project.pk}",
        defaults={
            "task": LOOP_TASK,
            "interval": interval,
            "kwargs": json.dumps({"project_id": project.pk, "settings": settings.to_dict()}),
            "enabled": enabled,
        },
    )
    return task


def loop_schedule_pause(*, project: Project, paused: bool = True) -> bool:
    """Pause (or resume) the project's loop schedule; return whether one exists."""
    from django_celery_beat.models import PeriodicTask

    return bool(
        PeriodicTask.objects.filter(name=f"prefloop-loop-{project.pk}").update(enabled=not paused)
    )


def loop_schedule_paused(*, project_id: int) -> bool:
    """Return whether the project has a loop schedule and it is paused."""
    from django_celery_beat.models import PeriodicTask

    return PeriodicTask.objects.filter(name=f"prefloop-loop-{project_id}", enabled=False).exists()
