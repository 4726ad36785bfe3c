"""Submitting: turn an annotator's answer into a stored judgment, once.

The answer is checked against the project's settings and mapped from the sides shown to the
canonical candidate order (`annotation.labels`); the judgment, the finished assignment and
both counters are written in one statement (`_judgment_record`). A retry with the same
idempotency key returns the first judgment. Quality control is called after commit through
`annotation.hooks`, and the next item can be served in the same transaction.
"""

import functools
import random
from dataclasses import dataclass

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from annotation import hooks, labels, sql
from annotation.errors import Conflict, NotFound, ServiceError
from annotation.members import label_source_for
from annotation.models import Assignment, Item, Judgment, Membership, Project, TaskKind
from annotation.serving import (
    assignment_next,
    assignment_prefetch,
    expire_if_overdue,
    locked_with_project_sql,
    serve_for_membership,
)

PAIRWISE_SHOWN = ("A", "B", "tie", "both_bad")


@dataclass(frozen=True)
class SubmitResult:
    judgment: Judgment
    replayed: bool
    # Filled only when the submit was asked for the next item too (`serve_next`).
    next_assignment: Assignment | None = None
    # Why no next item was served although one was asked for (paused, skip budget spent).
    next_error: "ServiceError | None" = None
    # Filled only when the item after the next was asked for too (`serve_ahead`): the page
    # holds it under its own lease (prefetch, see annotation.serving).
    ahead_assignment: Assignment | None = None


def _assignment_for_submit(*, assignment_id: int, user) -> tuple[Assignment, object]:
    """Lock the assignment; return it (with its project) and the annotator's last finish.

    The last finish (submit or skip, in any project) comes in the same statement: it is
    where the server's time on task starts when it is later than the lease.
    """
    found = sql.fetch_one(
        _assignment_for_submit_sql(connection.vendor), [assignment_id, user.pk], Assignment, Project
    )
    if found is None:
        raise NotFound("No such assignment.")
    assignment, assignment.project, last_finished = found
    return assignment, sql.field_value(Membership, "last_finished_at", last_finished)


@functools.cache
def _assignment_for_submit_sql(vendor: str) -> str:
    memberships = Membership._meta.db_table
    last_finished = (
        f'(SELECT MAX(m."last_finished_at") FROM "{memberships}" m '
        f'WHERE m."user_id" = x."annotator_id")'
    )
    return locked_with_project_sql(
        Assignment, 'x."id" = %s AND x."annotator_id" = %s', vendor, f", {last_finished}"
    )


def _pairwise_to_canonical(*, project: Project, shown: str, order: list[int]) -> str:
    if shown not in PAIRWISE_SHOWN:
        raise ServiceError(f"choice must be one of {', '.join(PAIRWISE_SHOWN)}.", code="choice")
    if shown == "tie" and not project.allow_tie:
        raise ServiceError("This project does not allow ties.", code="choice_disabled")
    if shown == "both_bad" and not project.allow_both_bad:
        raise ServiceError("This project does not allow 'both bad'.", code="choice_disabled")
    if shown in ("tie", "both_bad"):
        return shown
    return labels.choice_to_canonical(shown, order)


def _ranking_to_canonical(*, project: Project, ranks, order: list[int]) -> list[int]:
    k = project.k
    if not isinstance(ranks, list) or len(ranks) != k:
        raise ServiceError(
            f"ranking must list a rank for each of the {k} candidates.", code="ranking"
        )
    if not all(isinstance(r, int) and not isinstance(r, bool) and 1 <= r <= k for r in ranks):
        raise ServiceError(f"ranks must be whole numbers from 1 to {k}.", code="ranking")
    distinct = sorted(set(ranks))
    if len(distinct) < k and not project.allow_tie:
        raise ServiceError("This project does not allow tied ranks.", code="choice_disabled")
    # Ranks must be dense from 1 ("1,1,2" and "1,2,3"; not "1,3,3" or "2,2,3").
    if distinct != list(range(1, len(distinct) + 1)):
        raise ServiceError(
            "ranks must start at 1 with no gaps (ties share a rank).", code="ranking"
        )
    return labels.ranking_to_canonical(ranks, order)


def judgment_submit(
    *,
    assignment_id: int,
    user,
    idempotency_key: str = "",
    choice: str | None = None,
    ranking: list[int] | None = None,
    strength: str = "",
    confidence: int | None = None,
    rationale: str = "",
    time_spent_ms: int | None = None,
    source: str | None = None,
    serve_next: bool = False,
    serve_ahead: bool = False,
    rng: random.Random | None = None,
) -> SubmitResult:
    """Record a judgment for a live assignment; a retry with the same key returns the first."""
    if source is None:
        source = label_source_for(user=user)
    try:
        with transaction.atomic():
            return _judgment_submit_locked(
                serve_next=serve_next,
                serve_ahead=serve_ahead,
                rng=rng or random.Random(),
                assignment_id=assignment_id,
                user=user,
                idempotency_key=idempotency_key,
                choice=choice,
                ranking=ranking,
                strength=strength,
                confidence=confidence,
                rationale=rationale,
                time_spent_ms=time_spent_ms,
                source=source,
            )
    except _AlreadySubmitted:
        # The usual retry: the first submit went through. The same key gets its judgment.
        if idempotency_key:
            previous = _judgment_by_key(user=user, key=idempotency_key, assignment_id=assignment_id)
            if previous is not None:
                return _replayed(
                    previous, user=user, serve_next=serve_next, serve_ahead=serve_ahead, rng=rng
                )
        raise Conflict("This assignment was already submitted.", code="already_submitted") from None
    except IntegrityError:
        # A concurrent retry with the same key won the race, or the key was used for
        # another assignment; answer with the first judgment, or say so.
        if idempotency_key:
            previous = _judgment_by_key(user=user, key=idempotency_key, assignment_id=assignment_id)
            if previous is not None:
                return _replayed(
                    previous, user=user, serve_next=serve_next, serve_ahead=serve_ahead, rng=rng
                )
        raise


def _replayed(
    judgment: Judgment, *, user, serve_next: bool, serve_ahead: bool, rng
) -> SubmitResult:
    """Answer a replayed submit; the next item is what `next` serves now.

    The first answer's next item is the annotator's one live lease while it lasts, and
    `next` returns that live lease, so a replay sees the same item until its lease ends.
    """
    if not serve_next:
        return SubmitResult(judgment, replayed=True)
    try:
        following = assignment_next(project_id=judgment.project_id, user=user, rng=rng)
        ahead = None
        if serve_ahead and following is not None:
            ahead = assignment_prefetch(project_id=judgment.project_id, user=user, rng=rng)
    except ServiceError as error:
        return SubmitResult(judgment, replayed=True, next_error=error)
    return SubmitResult(judgment, replayed=True, next_assignment=following, ahead_assignment=ahead)


class _AlreadySubmitted(Exception):
    """Raised inside the submit transaction; answered outside it (replay or 409)."""


def _judgment_by_key(*, user, key: str, assignment_id: int) -> Judgment | None:
    previous = Judgment.objects.filter(annotator=user, idempotency_key=key).first()
    if previous is not None and previous.assignment_id != assignment_id:
        raise Conflict("This idempotency key was used for another assignment.", code="key_reused")
    return previous


def _judgment_submit_locked(
    *,
    assignment_id,
    user,
    idempotency_key,
    choice,
    ranking,
    strength,
    confidence,
    rationale,
    time_spent_ms,
    source,
    serve_next,
    serve_ahead,
    rng,
) -> SubmitResult:
    """Check and store the judgment under the assignment's row lock; serve the next on ask."""
    assignment, last_finished = _assignment_for_submit(assignment_id=assignment_id, user=user)
    project = assignment.project
    now = timezone.now()
    _assignment_check_open(assignment, now=now)
    answer = _answer_fields(project, order=assignment.display_order, choice=choice, ranking=ranking)
    _extras_check(project, strength=strength, confidence=confidence, rationale=rationale)
    judgment = Judgment(
        project=project,
        item_id=assignment.item_id,
        assignment=assignment,
        annotator=user,
        strength=strength,
        confidence=confidence,
        rationale=rationale,
        time_spent_ms=time_spent_ms,
        server_time_ms=_server_time_ms(assignment, last_finished=last_finished, now=now),
        idempotency_key=idempotency_key,
        source=source,
        is_gold=assignment.kind == Assignment.Kind.GOLD,
        is_repeat=assignment.kind == Assignment.Kind.REPEAT,
        **answer,
    )
    membership, held_ahead = _judgment_record(
        judgment=judgment, assignment=assignment, user=user, now=now
    )
    _quality_control_on_commit(assignment=assignment, user=user)
    if not serve_next or membership is None:
        return SubmitResult(judgment, replayed=False)
    return _with_next_item(
        judgment,
        membership=membership,
        user=user,
        rng=rng,
        serve_ahead=serve_ahead,
        held_ahead=held_ahead,
    )


def _assignment_check_open(assignment: Assignment, *, now) -> None:
    """Raise unless the assignment's lease is live (an overdue lease is expired first)."""
    if assignment.status == Assignment.Status.SUBMITTED:
        raise _AlreadySubmitted
    expire_if_overdue(assignment, now)
    if assignment.status == Assignment.Status.EXPIRED:
        raise Conflict(
            "The lease on this item expired; ask for the next item.", code="lease_expired"
        )
    if assignment.status == Assignment.Status.SKIPPED:
        raise Conflict("This assignment was skipped.", code="skipped")


def _answer_fields(project: Project, *, order: list[int], choice, ranking) -> dict:
    """Return the judgment's canonical answer and the answer as shown, from the press."""
    if project.task_kind == TaskKind.PAIRWISE:
        if choice is None or ranking is not None:
            raise ServiceError("A pairwise item takes a `choice` and no `ranking`.", code="choice")
        return {
            "choice": _pairwise_to_canonical(project=project, shown=choice, order=order),
            "shown_choice": choice,
        }
    if ranking is None or choice is not None:
        raise ServiceError("A ranking item takes a `ranking` and no `choice`.", code="ranking")
    return {
        "ranking": _ranking_to_canonical(project=project, ranks=ranking, order=order),
        "shown_choice": ",".join(str(r) for r in ranking),
    }


def _extras_check(project: Project, *, strength: str, confidence, rationale: str) -> None:
    """Raise unless strength, confidence and rationale are asked for by the project and valid."""
    if strength:
        if not project.ask_strength:
            raise ServiceError("This project does not ask for strength.", code="choice_disabled")
        if strength not in Judgment.Strength.values:
            raise ServiceError("strength must be 'slightly' or 'much'.", code="strength")
    if confidence is not None:
        if not project.ask_confidence:
            raise ServiceError("This project does not ask for confidence.", code="choice_disabled")
        if not (isinstance(confidence, int) and 1 <= confidence <= 5):
            raise ServiceError("confidence must be a whole number from 1 to 5.", code="confidence")
    if rationale and not project.ask_rationale:
        raise ServiceError("This project does not ask for a rationale.", code="choice_disabled")
    if len(rationale) > 10_000:
        raise ServiceError("rationale is longer than 10,000 characters.", code="rationale")


def _server_time_ms(assignment: Assignment, *, last_finished, now) -> int:
    """Return the server's time on task in milliseconds.

    Timed from when the item could be shown: its lease, or the annotator's last finish if
    later (an item leased ahead in another project waits until the one before is done).
    """
    started = max(assignment.leased_at, last_finished or assignment.leased_at)
    return max(0, round((now - started).total_seconds() * 1000))


def _quality_control_on_commit(*, assignment: Assignment, user) -> None:
    """Tell the registered hooks (quality control) about the judgment once it commits."""
    # Quality control runs in a Celery task every N judgments; the submit only counts.
    # `seq` is the annotator's count when this item was served, so this is their count now
    # give or take judgments submitted meanwhile: close enough to space the checks.
    count = assignment.seq + 1
    project_id, user_id = assignment.project_id, user.pk
    transaction.on_commit(
        lambda: hooks.judgment_submitted(
            project_id=project_id, annotator_id=user_id, judgment_count=count
        ),
        robust=True,
    )


def _with_next_item(
    judgment: Judgment,
    *,
    membership: Membership,
    user,
    rng,
    serve_ahead: bool,
    held_ahead: bool,
) -> SubmitResult:
    """Return the stored judgment with the annotator's next item, served in this transaction
    (the item held ahead when there is one), and on ask the one after it, held ahead."""
    # The membership row is locked by the count update, as `next` locks it. The lease just
    # submitted was the annotator's only current one in this project (a database
    # constraint), so the only live lease left is one held ahead, if the page prefetched
    # one; the record statement said whether there is one, which saves a lookup.
    try:
        following = serve_for_membership(
            membership=membership, user=user, rng=rng, live_possible=held_ahead
        )
        ahead = None
        if serve_ahead and following is not None:
            ahead = serve_for_membership(membership=membership, user=user, rng=rng, ahead=True)
    except ServiceError as error:
        # Paused, or the skip budget is spent: the judgment stands, no item comes with it.
        return SubmitResult(judgment, replayed=False, next_error=error)
    return SubmitResult(judgment, replayed=False, next_assignment=following, ahead_assignment=ahead)


def _judgment_record(
    *, judgment: Judgment, assignment: Assignment, user, now
) -> tuple[Membership | None, bool]:
    """Store the judgment, finish its assignment, count it on the item and the membership.

    Hand-written statements (annotation/sql.py): compiling them with the ORM cost more CPU
    than the rest of the submit. On PostgreSQL the four writes are one statement (data-
    modifying CTEs), one round trip instead of four. Return the membership, now locked, and
    whether the annotator holds an item ahead (always assumed on other databases).
    """
    finished = [
        Assignment.Status.SUBMITTED,
        connection.ops.adapt_datetimefield_value(now),
        assignment.pk,
    ]
    counts_done = assignment.kind != Assignment.Kind.REPEAT
    membership_params = [
        connection.ops.adapt_datetimefield_value(now),
        assignment.project_id,
        user.pk,
    ]
    if connection.vendor != "postgresql":
        sql.insert(judgment)
        sql.execute(_finish_sql(), finished)
        if counts_done:
            sql.execute(_count_done_sql(), [assignment.item_id])
        return _membership_count_judgment(project=assignment.project, user=user, now=now), True
    insert, insert_params = sql.insert_parts(judgment)
    found = sql.fetch_one(
        _judgment_record_sql(insert),
        [
            *insert_params,
            *finished,
            assignment.item_id,
            counts_done,
            *membership_params,
            assignment.project_id,
            user.pk,
            Assignment.Status.LEASED,
        ],
        Membership,
    )
    held_ahead = False
    if found is None:  # no longer a member: the judgment stands all the same
        judgment.pk = Judgment.objects.filter(assignment_id=assignment.pk).values_list(
            "pk", flat=True
        )[0]
        membership = None
    else:
        membership, judgment.pk, held_ahead = found
        membership.project = assignment.project
    judgment._state.adding = False
    judgment._state.db = connection.alias
    return membership, held_ahead


@functools.cache
def _judgment_record_sql(insert: str) -> str:
    return (
        f"WITH j AS ({insert}), "
        f"a AS ({_finish_sql()}), "
        f'i AS (UPDATE "{Item._meta.db_table}" SET "n_done" = "n_done" + 1 '
        f'WHERE "id" = %s AND %s) '
        f"{_membership_count_sql('postgresql')}, (SELECT * FROM j), "
        f'EXISTS (SELECT 1 FROM "{Assignment._meta.db_table}" h WHERE h."project_id" = %s '
        f'AND h."annotator_id" = %s AND h."status" = %s AND h."ahead")'
    )


@functools.cache
def _finish_sql() -> str:
    table = Assignment._meta.db_table
    return f'UPDATE "{table}" SET "status" = %s, "finished_at" = %s WHERE "id" = %s'


@functools.cache
def _count_done_sql() -> str:
    return f'UPDATE "{Item._meta.db_table}" SET "n_done" = "n_done" + 1 WHERE "id" = %s'


def _membership_count_judgment(*, project: Project, user, now) -> Membership | None:
    """Count a judgment on the annotator's membership; return the (now locked) row."""
    found = sql.fetch_one(
        _membership_count_sql(connection.vendor),
        [connection.ops.adapt_datetimefield_value(now), project.pk, user.pk],
        Membership,
    )
    if found is None:
        return None
    membership = found[0]
    membership.project = project
    return membership


@functools.cache
def _membership_count_sql(vendor: str) -> str:
    # UPDATE ... RETURNING: PostgreSQL, and SQLite from 3.35.
    return (
        f'UPDATE "{Membership._meta.db_table}" SET "judgment_count" = "judgment_count" + 1, '
        f'"skips_in_row" = 0, "last_finished_at" = %s '
        f'WHERE "project_id" = %s AND "user_id" = %s RETURNING {sql.columns(Membership)}'
    )
