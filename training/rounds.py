"""Rounds generated from registered policies: by the loop, and by a researcher's generation job.

A round's candidates are sampled through the policy's backend (`training.generation`), then
imported with the items importer (`annotation.imports.items_import`) in one transaction, so
nothing half made is ever served: a generation that fails leaves no round with items.

Two kinds of round come from a `GenerationJob`:

    k_samples     K answers of one policy per prompt (K = the project's k), each candidate
                  with its own sampling settings when given (e.g. temperatures 0.7 and 1.0);
    side_by_side  one answer of each of K policies per prompt (new vs previous vs base,
                  as in Chatbot Arena battles, Chiang et al. 2024), the model name recorded on
                  each candidate; annotators see them in the display order the server draws.

Prompts come from the project's prompt pool (`annotation.prompt_pool`): the train split for
a training round, the eval split for a human evaluation round, least used first.
"""

from __future__ import annotations

import io
import json
import logging
import re
import time
import uuid
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from annotation import services as annotation_services
from annotation.errors import NotFound, ServiceError
from annotation.imports import ImportFailed, items_import, normalise
from annotation.models import Candidate, Project, Prompt, Round
from annotation.prompt_pool import PromptPayload, prompt_payload, prompt_pool_draw
from training.generation import GenerationError, GenerationSettings
from training.generation.endpoints import candidates_generate
from training.models import GenerationJob, ModelVersion
from training.round_requests import (
    MAX_PROMPTS,
    MODES,
    GenerationRequest,
    InvalidGenerationRequest,
    _policy_check,
    sampling_check,
)

if TYPE_CHECKING:
    from training.loop.settings import LoopSettings

logger = logging.getLogger(__name__)

PROGRESS_EVERY_SECONDS = 0.5
_KEY = re.compile(r"^[\w.\-:]{1,100}$")


# --------------------------------------------------------------------------- shared


def prompt_row(prompt: PromptPayload, candidates: list[dict]) -> dict:
    """Return an items-import row: a text prompt as 'prompt', chat messages as 'messages'."""
    key = "prompt" if isinstance(prompt, str) else "messages"
    return {key: prompt, "candidates": candidates}


def _rows_of_distinct_answers(
    prompts: list[PromptPayload],
    new: list[list[dict]],
    old: list[list[dict]],
    *,
    k: int,
    from_new: int,
) -> list[dict]:
    """Return import rows of the prompts that got k distinct answers (k - from_new old ones)."""
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
            rows.append(prompt_row(prompt, picked))
    return rows


def _import_rows(
    *, project: Project, round_: Round, rows: list[dict], policies: list[ModelVersion]
) -> list[dict]:
    """Import rows into the round (inside the caller's transaction); return those imported.

    Prompts the importer refuses (e.g. a pair of answers already asked) are left out. The
    round's candidates are linked to the registered policies that wrote them, resolved here
    by the names the generation backend recorded, never from the rows.
    """
    while rows:
        try:
            items_import(
                project=project,
                stream=io.StringIO("\n".join(json.dumps(r) for r in rows)),
                round_=round_,
            )
            _candidates_link(round_=round_, policies=policies)
            return rows
        except ImportFailed as exc:
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
    return rows


def _candidates_link(*, round_: Round, policies: list[ModelVersion]) -> None:
    """Set `Candidate.policy_version` of the round's candidates each policy generated."""
    for policy in policies:
        Candidate.objects.filter(
            slots__item__round=round_, model_name=policy.name, policy_version__isnull=True
        ).update(policy_version=policy)


# --------------------------------------------------------------------------- the loop's round


def round_generate(
    *,
    project: Project,
    model_version: ModelVersion,
    prompts: list[PromptPayload],
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
    # A backend failure (e.g. an endpoint that does not answer) raises before anything is
    # imported, so the round stays without items: nothing half made is served.
    new = candidates_generate(
        model_version=model_version, prompts=prompts, k=from_new * 2, settings=gen
    )
    old = (
        candidates_generate(model_version=mix_with, prompts=prompts, k=2, settings=gen)
        if from_new < k
        else [[] for _ in prompts]
    )
    rows = _rows_of_distinct_answers(prompts, new, old, k=k, from_new=from_new)
    with transaction.atomic():
        Round.objects.select_for_update().filter(pk=round_.pk).first()
        if round_.items.exists():
            return round_
        rows = _import_rows(
            project=project,
            round_=round_,
            rows=rows,
            policies=[model_version] + ([mix_with] if mix_with is not None else []),
        )
    logger.info(
        "round %s: %d of %d prompts had %d distinct answers",
        round_.number,
        len(rows),
        len(prompts),
        k,
    )
    return round_


def generate_round_now(
    *, project_id: int, model_version_id: int, source_key: str, settings: dict
) -> Round:
    """Choose prompts and generate the loop's round keyed by source_key (idempotent)."""
    from training.loop.mining import prompts_select, reward_models_newest
    from training.loop.settings import LoopSettings

    project = Project.objects.get(pk=project_id)
    policy = ModelVersion.objects.get(pk=model_version_id)
    loop_settings = LoopSettings.from_dict(settings)
    prompts = prompts_select(
        project=project,
        settings=loop_settings,
        reward_models=reward_models_newest(project=project),
    )
    if not prompts:
        raise ServiceError(
            f"project {project.pk}: no prompts for the next round; import prompts into its "
            "pool (the train split feeds training rounds)."
        )
    return round_generate(
        project=project,
        model_version=policy,
        prompts=prompts,
        settings=loop_settings,
        mix_with=policy.parent if loop_settings.mix_previous else None,
        source_key=source_key,
    )


# --------------------------------------------------------------------------- generation jobs


def project_policies_ready(*, project: Project) -> list[ModelVersion]:
    """Return the project's ready policies (local or behind an endpoint), newest first."""
    from django.db.models import Q

    from training.selectors import model_version_project_id

    versions = (
        ModelVersion.objects.filter(
            Q(training_run__project=project)
            | Q(dataset_version__project=project)
            | Q(project=project),
            status=ModelVersion.Status.READY,
        )
        .exclude(kind=ModelVersion.Kind.REWARD)
        .select_related("training_run", "dataset_version")
        .distinct()
        .order_by("-created_at", "-id")
    )
    return [v for v in versions if model_version_project_id(version=v) == project.pk]


def generation_job_create(
    *,
    project: Project,
    user,
    policies: Any,
    mode: str = "k_samples",
    n_prompts: Any = 0,
    sampling: Any = None,
    seed: Any = 0,
    purpose: str = Round.Purpose.TRAIN,
    source_key: str = "",
    enqueue: bool = True,
) -> GenerationJob:
    """Check a round request and queue its generation job on the gpu queue (after commit).

    Refused with a 400 naming the field, before anything is written: an unknown mode or
    purpose, a policy id not of this project, a reward model, a version not `ready`, an empty
    pool split or one smaller than `n_prompts`, bad sampling settings. The same `source_key`
    again returns the first job instead of queueing another.
    """
    if source_key:
        if not isinstance(source_key, str) or not _KEY.match(source_key):
            raise InvalidGenerationRequest(
                "letters, digits and . - _ : only, up to 100 characters.", field="source_key"
            )
        key = f"genjob-{project.pk}-{source_key}"
        existing = GenerationJob.objects.filter(source_key=key).first()
        if existing is not None:
            return existing
    else:
        key = f"genjob-{project.pk}-{uuid.uuid4().hex}"
    if mode not in MODES:
        raise InvalidGenerationRequest(f"one of {', '.join(MODES)}.", field="mode")
    if purpose not in Round.Purpose.values:
        raise InvalidGenerationRequest(
            f"one of {', '.join(Round.Purpose.values)}.", field="purpose"
        )
    if not isinstance(policies, list) or not policies:
        raise InvalidGenerationRequest("give a list of model version ids.", field="policies")
    if len(set(map(repr, policies))) < len(policies):
        raise InvalidGenerationRequest("a policy is listed twice.", field="policies")
    if mode == "k_samples" and len(policies) != 1:
        raise InvalidGenerationRequest(
            f"k_samples takes one policy (its {project.k} samples per prompt); "
            "side_by_side compares several.",
            field="policies",
        )
    if mode == "side_by_side" and len(policies) != project.k:
        raise InvalidGenerationRequest(
            f"side_by_side takes one policy per candidate: this project shows {project.k} "
            f"answers per prompt, {len(policies)} policies were given.",
            field="policies",
        )
    versions = [
        _policy_check(project=project, version_id=v, index=i) for i, v in enumerate(policies)
    ]
    if isinstance(n_prompts, bool) or not isinstance(n_prompts, int) or n_prompts < 1:
        raise InvalidGenerationRequest("a positive whole number.", field="n_prompts")
    if n_prompts > MAX_PROMPTS:
        raise InvalidGenerationRequest(f"at most {MAX_PROMPTS} prompts a round.", field="n_prompts")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise InvalidGenerationRequest("a whole number from 0 to 2^31 - 1.", field="seed")
    clean_sampling = sampling_check(sampling, n_candidates=project.k)
    split = Prompt.Split.EVAL if purpose == Round.Purpose.EVAL else Prompt.Split.TRAIN
    available = Prompt.objects.filter(project=project, in_pool=True, split=split).count()
    if available == 0:
        raise InvalidGenerationRequest(
            f"the project's prompt pool has no {split} prompts; import prompts first.",
            field="n_prompts",
        )
    if available < n_prompts:
        raise InvalidGenerationRequest(
            f"the prompt pool's {split} split holds {available} prompt(s), fewer than the "
            f"{n_prompts} asked.",
            field="n_prompts",
        )
    request = GenerationRequest(
        mode=mode,
        policies=[v.pk for v in versions],
        n_prompts=n_prompts,
        sampling=clean_sampling,
        seed=seed,
        purpose=purpose,
    )
    with transaction.atomic():
        job = GenerationJob.objects.create(
            project=project,
            request={f.name: getattr(request, f.name) for f in fields(request)},
            source_key=key,
            n_prompts=n_prompts,
            created_by=user if getattr(user, "pk", None) else None,
        )
        job.policies.set(versions)
        if enqueue:
            from training.tasks import run_generation_job

            transaction.on_commit(lambda: run_generation_job.delay(job.pk))
    return job


class _ProgressWriter:
    """Record the share of samples generated on the job row, at most every half second."""

    def __init__(self, job_id: int, total: int):
        self.job_id, self.total, self.done, self.last = job_id, max(total, 1), 0, 0.0

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_SECONDS:
            self.last = now
            GenerationJob.objects.filter(pk=self.job_id).update(
                progress=min(self.done / self.total, 0.99)
            )


def _claim(job_id: int) -> GenerationJob | None:
    with transaction.atomic():
        job = GenerationJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.status in (
            GenerationJob.Status.SUCCEEDED,
            GenerationJob.Status.FAILED,
        ):
            return None
        # A redelivered job (its worker died) starts again from nothing: no round was made.
        job.status, job.progress, job.error = GenerationJob.Status.RUNNING, 0.0, ""
        job.started_at = timezone.now()
        job.save(update_fields=["status", "progress", "error", "started_at"])
        return job


def generation_job_fail(*, job_id: int, error: str) -> None:
    """Record a job's failure; a round it made (if any) is archived, never served.

    Server paths in the error (a model folder that does not load) are hidden from researchers.
    """
    from training.config_policy import paths_redact

    error = paths_redact(error)
    with transaction.atomic():
        job = GenerationJob.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.status == GenerationJob.Status.SUCCEEDED:
            return
        job.status, job.error, job.finished_at = GenerationJob.Status.FAILED, error, timezone.now()
        job.save(update_fields=["status", "error", "finished_at"])
        Round.objects.filter(source_key=job.source_key, project=job.project).update(
            archived=True, status=Round.Status.CLOSED
        )


def _candidate_groups(
    request: GenerationRequest, versions: dict[int, ModelVersion]
) -> list[tuple[ModelVersion, GenerationSettings, int]]:
    """Return (policy, settings, answers) groups whose answers make up one item's K."""
    base = {"seed": request.seed}
    if request.mode == "side_by_side":
        return [
            (
                versions[pk],
                GenerationSettings(**{**settings, "seed": request.seed + 7919 * i}),
                1,
            )
            for i, (pk, settings) in enumerate(zip(request.policies, request.sampling, strict=True))
        ]
    policy = versions[request.policies[0]]
    if all(s == request.sampling[0] for s in request.sampling):
        return [
            (policy, GenerationSettings(**{**request.sampling[0], **base}), len(request.sampling))
        ]
    return [
        (policy, GenerationSettings(**{**settings, "seed": request.seed + 7919 * i}), 1)
        for i, settings in enumerate(request.sampling)
    ]


def _pick_distinct(groups_out: list[list[dict]], counts: list[int]) -> list[dict] | None:
    """Return `counts[g]` answers of each group, all texts distinct, or None."""
    picked, seen = [], set()
    for cands, count in zip(groups_out, counts, strict=True):
        taken = 0
        for cand in cands:
            key = normalise(cand["text"])
            if taken == count:
                break
            if not key or key in seen:
                continue
            seen.add(key)
            picked.append(cand)
            taken += 1
        if taken < count:
            return None
    return picked


def generation_job_run(*, job_id: int) -> GenerationJob | None:
    """Generate and open the job's round; a finished job is left alone.

    Candidates are sampled first, outside any transaction; the round and its items are then
    created in one transaction. A failure records the error on the job and opens no round.
    """
    job = _claim(job_id)
    if job is None:
        return GenerationJob.objects.filter(pk=job_id).first()
    try:
        return _generate(job)
    except (OperationalError, InterfaceError):
        # A lost database connection: the task retries the job (it opened no round).
        GenerationJob.objects.filter(pk=job.pk).update(status=GenerationJob.Status.QUEUED)
        raise
    except Exception as exc:  # a model that does not load, a backend error, ...
        generation_job_fail(job_id=job.pk, error=f"{type(exc).__name__}: {exc}")
        return GenerationJob.objects.get(pk=job.pk)


def _generate(job: GenerationJob) -> GenerationJob:
    request = GenerationRequest(**job.request)
    project = job.project
    versions = {v.pk: v for v in ModelVersion.objects.filter(pk__in=request.policies)}
    split = Prompt.Split.EVAL if request.purpose == Round.Purpose.EVAL else Prompt.Split.TRAIN
    prompts = [
        prompt_payload(p)
        for p in prompt_pool_draw(
            project=project, n=request.n_prompts, split=split, seed=request.seed
        )
    ]
    if not prompts:
        raise ServiceError(f"the prompt pool's {split} split is empty.")
    groups = _candidate_groups(request, versions)
    # Twice the answers each group needs, so that repeats can be dropped and K distinct remain.
    total = sum(len(prompts) * count * 2 for _, _, count in groups)
    progress = _ProgressWriter(job.pk, total)
    outputs = [
        candidates_generate(
            model_version=policy,
            prompts=prompts,
            k=count * 2,
            settings=settings,
            progress=progress,
        )
        for policy, settings, count in groups
    ]
    rows = []
    for i, prompt in enumerate(prompts):
        picked = _pick_distinct([out[i] for out in outputs], [count for _, _, count in groups])
        if picked is not None:
            rows.append(prompt_row(prompt, picked))
    if not rows:
        raise GenerationError(
            f"no prompt got {project.k} distinct answers from the policies; try a higher "
            "temperature or more new tokens."
        )
    with transaction.atomic():
        job = GenerationJob.objects.select_for_update().get(pk=job.pk)
        if job.status != GenerationJob.Status.RUNNING:
            return job
        round_ = annotation_services.round_create(
            project=project,
            model_version=versions[request.policies[0]],
            source_key=job.source_key,
        )
        if round_.purpose != request.purpose:
            round_.purpose = request.purpose
            round_.save(update_fields=["purpose"])
        rows = _import_rows(
            project=project, round_=round_, rows=rows, policies=list(versions.values())
        )
        if not rows:
            raise ImportFailed([(0, "the importer refused every generated prompt")], 1)
        job.round = round_
        job.status, job.progress = GenerationJob.Status.SUCCEEDED, 1.0
        job.n_items = round_.items.count()
        job.finished_at = timezone.now()
        job.save(update_fields=["round", "status", "progress", "n_items", "finished_at"])
    logger.info(
        "generation job %s: round %s with %d of %d prompts",
        job.pk,
        round_.number,
        len(rows),
        len(prompts),
    )
    return job


def generation_job_get(*, project: Project, job_id: int) -> GenerationJob:
    """Return one of the project's generation jobs; 404 for any other id."""
    job = GenerationJob.objects.filter(project=project, pk=job_id).select_related("round").first()
    if job is None:
        raise NotFound("No such generation job in this project.")
    return job
