"""Write-side business logic: serving, submitting, skipping, leases, membership.

Serving is correct under concurrency on PostgreSQL:
- an annotator's calls are serialised by a row lock on their Membership;
- items are claimed with `SELECT ... FOR UPDATE SKIP LOCKED` and their `n_taken` counter is
  bumped in the same statement (`_claim_primary`), so a concurrent claimer that read a stale
  row re-checks `n_taken < overlap` on the new row version (PostgreSQL's EvalPlanQual) and
  moves on;
- every other path that changes `n_taken` (expiry, skip) locks the item row too.

Blindness: gold items and planned repeats are drawn only while primary work remains for the
annotator (the gold claim carries that test in its own statement), so a 204 means "done"
whatever the kind, and skipping every primary item ends the work instead of unlocking the gold.
Items of equal fill are served in a per-annotator order (a keyed hash of the item id), so
people working at the same moment do not move through the items in lockstep.
"""

import functools
import hashlib
import hmac
import random
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from annotation import hooks, labels, sql
from annotation.errors import Conflict, Forbidden, NotFound, ServiceError, SkipBudgetSpent
from annotation.models import (
    Assignment,
    Item,
    Judgment,
    LabelSource,
    Membership,
    Project,
    Round,
    Skip,
    TaskKind,
)

PAIRWISE_SHOWN = ("A", "B", "tie", "both_bad")
# Accounts in these groups label as machines; their judgments never pass for human ones.
SOURCE_GROUPS = {"prefloop:simulated": LabelSource.SIMULATED, "prefloop:ai": LabelSource.AI}
EXPIRY_BATCH = 100
# The claim shuffles (per annotator) the this-many least-filled items it could serve, in
# (n_taken, id) order: shuffling every open item costs a sort of the whole round per request
# (60 ms at 20k items against 0.1 ms), and a window this wide already keeps concurrent
# annotators apart.
SHUFFLE_WINDOW = 64


@dataclass(frozen=True)
class SubmitResult:
    judgment: Judgment
    replayed: bool
    # Filled only when the submit was asked for the next item too (`serve_next`).
    next_assignment: Assignment | None = None
    # Why no next item was served although one was asked for (paused, skip budget spent).
    next_error: "ServiceError | None" = None


def _membership_for_update(*, project_id: int, user) -> Membership:
    membership = _locked_with_project(
        Membership, where='x."project_id" = %s AND x."user_id" = %s', params=[project_id, user.pk]
    )
    if membership is None:
        raise NotFound("No such project.")
    return membership


def _locked_with_project(model, *, where: str, params: list):
    """Lock the one row of `model` (aliased `x`) matching `where`; return it with its project."""
    found = sql.fetch_one(
        _locked_with_project_sql(model, where, connection.vendor), params, model, Project
    )
    if found is None:
        return None
    row, row.project = found
    return row


@functools.cache
def _locked_with_project_sql(model, where: str, vendor: str, extra: str = "") -> str:
    return (
        f"SELECT {sql.columns(model, 'x')}, {sql.columns(Project, 'p')}{extra} "
        f'FROM "{model._meta.db_table}" x JOIN "{Project._meta.db_table}" p '
        f'ON p."id" = x."project_id" WHERE {where}{sql.lock(vendor, "x")}'
    )


def leases_expire(*, project_id: int, now=None) -> int:
    """Mark overdue leases of a project expired and give their items back; return how many."""
    now = now or timezone.now()
    overdue = sql.fetch_all(
        _overdue_sql(connection.vendor),
        [project_id, Assignment.Status.LEASED, connection.ops.adapt_datetimefield_value(now)],
    )
    if not overdue:
        return 0
    # The rows are locked and still LEASED, so this update moves every one of them.
    Assignment.objects.filter(id__in=[a[0] for a in overdue]).update(
        status=Assignment.Status.EXPIRED, finished_at=now
    )
    _items_release(
        item_ids=[item_id for _, item_id, kind in overdue if kind != Assignment.Kind.REPEAT]
    )
    return len(overdue)


@functools.cache
def _overdue_sql(vendor: str) -> str:
    # Run by every `next`: written out once (see annotation/sql.py).
    return (
        f'SELECT "id", "item_id", "kind" FROM "{Assignment._meta.db_table}" '
        f'WHERE "project_id" = %s AND "status" = %s AND "lease_expires" < %s '
        f"LIMIT {EXPIRY_BATCH}{sql.lock(vendor, skip_locked=True)}"
    )


def _items_release(*, item_ids: list[int]) -> None:
    """Decrement `n_taken` once per listed item id, locking items in id order."""
    counts: dict[int, int] = {}
    for item_id in item_ids:
        counts[item_id] = counts.get(item_id, 0) + 1
    for item_id in sorted(counts):
        Item.objects.filter(pk=item_id).update(n_taken=F("n_taken") - counts[item_id])


def _display_order(k: int, rng: random.Random) -> list[int]:
    order = list(range(k))
    rng.shuffle(order)
    return order


def _serving_salt(user_id: int) -> str:
    """Return the annotator's key for the serving order: stable, and not guessable by others."""
    key = settings.SECRET_KEY.encode()
    return hmac.new(key, f"serving-order:{user_id}".encode(), hashlib.sha256).hexdigest()[:16]


def _primary_params(*, project: Project, user) -> list:
    """Parameters of `_primary_open_sql`, in order."""
    return [
        project.pk,
        Round.Status.OPEN,
        project.overlap,
        user.pk,
        Assignment.Status.EXPIRED,
        Assignment.Kind.REPEAT,
    ]


def _primary_open_sql(alias: str) -> str:
    """FROM/WHERE of the open primary items this annotator has not had (`_primary_params`)."""
    items, rounds = Item._meta.db_table, Round._meta.db_table
    assignments = Assignment._meta.db_table
    return f"""
        FROM "{items}" {alias} JOIN "{rounds}" {alias}r ON {alias}r."id" = {alias}."round_id"
        WHERE {alias}."project_id" = %s AND NOT {alias}."is_gold"
          AND {alias}r."status" = %s AND {alias}."n_taken" < %s
          AND NOT EXISTS (
              SELECT 1 FROM "{assignments}" {alias}a
              WHERE {alias}a."item_id" = {alias}."id" AND {alias}a."annotator_id" = %s
                AND {alias}a."status" <> %s AND {alias}a."kind" <> %s
          )
    """


def _claim_primary(*, project: Project, user) -> Item | None:
    """Claim a least-served open item this annotator has not had, and count it taken.

    One statement, the hottest of the serving path: the first subquery takes the
    `SHUFFLE_WINDOW` least-filled items the annotator may have and locks the first of them
    in the annotator's own order (`FOR UPDATE ... SKIP LOCKED` re-checks `n_taken < overlap`
    on the newest row version, so a row a concurrent claim filled is passed over); only when
    every one of them was taken meanwhile does the second, unshuffled one run. The outer
    UPDATE bumps the row.
    """
    primary = _primary_params(project=project, user=user)
    item_id = sql.fetch_value(
        _claim_primary_sql(connection.vendor),
        [*primary, project.overlap, _serving_salt(user.pk), *primary],
    )
    return None if item_id is None else Item(pk=item_id)


@functools.cache
def _claim_primary_sql(vendor: str) -> str:
    items = Item._meta.db_table
    return f"""
        UPDATE "{items}" SET "n_taken" = "n_taken" + 1
        WHERE "id" = COALESCE(
            (
                SELECT i."id" FROM "{items}" i
                WHERE i."id" IN (
                    SELECT w."id" {_primary_open_sql("w")}
                    ORDER BY w."n_taken", w."id" LIMIT {SHUFFLE_WINDOW}
                ) AND i."n_taken" < %s
                ORDER BY i."n_taken", MD5(CAST(i."id" AS TEXT) || %s)
                LIMIT 1
                {sql.lock(vendor, "i", skip_locked=True)}
            ),
            (
                SELECT f."id" {_primary_open_sql("f")}
                ORDER BY f."n_taken", f."id"
                LIMIT 1
                {sql.lock(vendor, "f", skip_locked=True)}
            )
        )
        RETURNING "id"
    """


def _claim_gold(*, project: Project, user) -> Item | None:
    """Claim a gold item the annotator has not had, only while primary work remains for them."""
    item_id = sql.fetch_value(
        _claim_gold_sql(),
        [
            project.pk,
            Round.Status.OPEN,
            user.pk,
            Assignment.Status.EXPIRED,
            *_primary_params(project=project, user=user),
            _serving_salt(user.pk),
        ],
    )
    return None if item_id is None else Item(pk=item_id)


@functools.cache
def _claim_gold_sql() -> str:
    items, rounds = Item._meta.db_table, Round._meta.db_table
    assignments = Assignment._meta.db_table
    # Gold has no overlap cap, so nothing to skip or re-check: the UPDATE's row lock suffices.
    return f"""
        UPDATE "{items}" SET "n_taken" = "n_taken" + 1
        WHERE "id" = (
            SELECT g."id" FROM "{items}" g JOIN "{rounds}" gr ON gr."id" = g."round_id"
            WHERE g."project_id" = %s AND g."is_gold" AND gr."status" = %s
              AND NOT EXISTS (
                  SELECT 1 FROM "{assignments}" ga
                  WHERE ga."item_id" = g."id" AND ga."annotator_id" = %s AND ga."status" <> %s
              )
              AND EXISTS (SELECT 1 {_primary_open_sql("w")})
            ORDER BY MD5(CAST(g."id" AS TEXT) || %s)
            LIMIT 1
        )
        RETURNING "id"
    """


def _primary_open(*, project: Project, user_id: int):
    """Return the open primary items the annotator has not had (as in `_primary_open_sql`)."""
    had = (
        Assignment.objects.filter(item=OuterRef("pk"), annotator_id=user_id)
        .exclude(status=Assignment.Status.EXPIRED)
        .exclude(kind=Assignment.Kind.REPEAT)
    )
    return Item.objects.filter(
        project=project,
        is_gold=False,
        round__status=Round.Status.OPEN,
        n_taken__lt=project.overlap,
    ).filter(~Exists(had))


def _claim_repeat(*, membership: Membership) -> Assignment | None:
    """Pick a submitted primary item to show again, only while primary work remains."""
    project = membership.project
    latest_seq = membership.judgment_count - project.repeat_min_gap
    if latest_seq < 0:
        return None
    already = Assignment.objects.filter(repeat_of=OuterRef("pk")).exclude(
        status=Assignment.Status.EXPIRED
    )
    return (
        Assignment.objects.filter(
            project=project,
            annotator_id=membership.user_id,
            kind=Assignment.Kind.PRIMARY,
            status=Assignment.Status.SUBMITTED,
            seq__lte=latest_seq,
            item__round__status=Round.Status.OPEN,
        )
        .filter(~Exists(already))
        .filter(Exists(_primary_open(project=project, user_id=membership.user_id)))
        .order_by("seq")
        .only("id", "item_id", "display_order")
        .first()
    )


def _skip_budget_spent(*, membership: Membership, project: Project) -> tuple[str, str] | None:
    """Return (message to the annotator, note to researchers) once their skips exceed the
    project's budget; None while they are within it."""
    in_row = membership.skips_in_row
    ask = "Ask the project's researchers to let you continue."
    if project.max_skips_in_row and in_row >= project.max_skips_in_row:
        return (
            f"You skipped {in_row} items in a row; this project allows "
            f"{project.max_skips_in_row}. {ask}",
            f"{in_row} skips in a row (limit {project.max_skips_in_row})",
        )
    skipped = membership.skip_count
    served = membership.judgment_count + skipped
    if served >= max(project.skip_fraction_min_served, 1) and (
        skipped > project.max_skip_fraction * served
    ):
        return (
            f"You skipped {skipped} of the {served} items you were served; this project "
            f"allows {project.max_skip_fraction:.0%}. {ask}",
            f"{skipped} of {served} served items skipped (limit {project.max_skip_fraction:.0%})",
        )
    return None


@transaction.atomic
def assignment_next(
    *, project_id: int, user, rng: random.Random | None = None
) -> Assignment | None:
    """Return the annotator's live assignment, or claim the next item for them; None when done."""
    membership = _membership_for_update(project_id=project_id, user=user)
    return _serve_next(membership=membership, user=user, rng=rng or random.Random())


def _serve_next(
    *, membership: Membership, user, rng: random.Random, live_possible: bool = True
) -> Assignment | None:
    """Serve the annotator of a locked membership their live lease or a new claim."""
    # `live_possible=False` saves the lease lookup when the caller knows there is none.
    project = membership.project
    if project.archived:
        raise NotFound("No such project.")
    if membership.status != Membership.Status.ACTIVE:
        raise Forbidden("Your annotation in this project is paused.", code="paused")
    now = timezone.now()
    lease_until = now + timedelta(seconds=project.lease_seconds)

    live = _live_assignment(project_id=project.pk, user=user) if live_possible else None
    if live is not None:
        if live.lease_expires >= now:
            live.lease_expires = lease_until
            live.save(update_fields=["lease_expires"])
            return live
        # The annotator's own lease ran out: release it before serving anew.
        _assignment_expire(live, now)
    spent = _skip_budget_spent(membership=membership, project=project)
    if spent is not None:
        raise SkipBudgetSpent(spent[0])
    leases_expire(project_id=project.pk, now=now)

    # The kind is drawn first, whatever the annotator did before; gold and repeats are then
    # served only while primary work remains for them (see the module docstring).
    draw = rng.random()
    kind, item, repeat_of, order = None, None, None, None
    if draw < project.gold_rate:
        item = _claim_gold(project=project, user=user)
        kind = Assignment.Kind.GOLD
    elif draw < project.gold_rate + project.repeat_rate:
        repeat_of = _claim_repeat(membership=membership)
        if repeat_of is not None:
            kind = Assignment.Kind.REPEAT
            item = Item(pk=repeat_of.item_id)
            # Sides flipped: the same candidates, shown in the reverse order.
            order = list(reversed(repeat_of.display_order))
    if item is None:
        item = _claim_primary(project=project, user=user)
        kind = Assignment.Kind.PRIMARY
    if item is None:
        return None
    return sql.insert(
        Assignment(
            project=project,
            item_id=item.pk,
            annotator=user,
            kind=kind,
            repeat_of=repeat_of,
            display_order=order or _display_order(project.k, rng),
            seq=membership.judgment_count,
            lease_expires=lease_until,
        )
    )


def _assignment_for_update(*, assignment_id: int, user) -> Assignment:
    assignment = _locked_with_project(
        Assignment, where='x."id" = %s AND x."annotator_id" = %s', params=[assignment_id, user.pk]
    )
    if assignment is None:
        raise NotFound("No such assignment.")
    return assignment


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
    return _locked_with_project_sql(
        Assignment, 'x."id" = %s AND x."annotator_id" = %s', vendor, f", {last_finished}"
    )


def _live_assignment(*, project_id: int, user) -> Assignment | None:
    """The annotator's leased assignment in a project (at most one: a DB constraint)."""
    found = sql.fetch_one(_live_sql(), [project_id, user.pk, Assignment.Status.LEASED], Assignment)
    return found[0] if found else None


@functools.cache
def _live_sql() -> str:
    return (
        f'SELECT {sql.columns(Assignment, "a")} FROM "{Assignment._meta.db_table}" a '
        f'WHERE a."project_id" = %s AND a."annotator_id" = %s AND a."status" = %s '
        f'ORDER BY a."id" DESC LIMIT 1'
    )


def _assignment_expire(assignment: Assignment, now) -> None:
    """Expire a lease once: only the caller whose update moved it off LEASED releases the item."""
    moved = Assignment.objects.filter(pk=assignment.pk, status=Assignment.Status.LEASED).update(
        status=Assignment.Status.EXPIRED, finished_at=now
    )
    if moved and assignment.kind != Assignment.Kind.REPEAT:
        _items_release(item_ids=[assignment.item_id])
    assignment.status = Assignment.Status.EXPIRED


def _expire_if_overdue(assignment: Assignment, now) -> None:
    if assignment.status == Assignment.Status.LEASED and assignment.lease_expires < now:
        _assignment_expire(assignment, now)


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
    rng: random.Random | None = None,
) -> SubmitResult:
    """Record a judgment for a live assignment; a retry with the same key returns the first."""
    if source is None:
        source = label_source_for(user=user)
    try:
        with transaction.atomic():
            return _judgment_submit_locked(
                serve_next=serve_next,
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
                return _replayed(previous, user=user, serve_next=serve_next, rng=rng)
        raise Conflict("This assignment was already submitted.", code="already_submitted") from None
    except IntegrityError:
        # A concurrent retry with the same key won the race, or the key was used for
        # another assignment; answer with the first judgment, or say so.
        if idempotency_key:
            previous = _judgment_by_key(user=user, key=idempotency_key, assignment_id=assignment_id)
            if previous is not None:
                return _replayed(previous, user=user, serve_next=serve_next, rng=rng)
        raise


def _replayed(judgment: Judgment, *, user, serve_next: bool, rng) -> SubmitResult:
    """Answer a replayed submit; the next item is what `next` serves now.

    The first answer's next item is the annotator's one live lease while it lasts, and
    `next` returns that live lease, so a replay sees the same item until its lease ends.
    """
    if not serve_next:
        return SubmitResult(judgment, replayed=True)
    try:
        following = assignment_next(project_id=judgment.project_id, user=user, rng=rng)
    except ServiceError as error:
        return SubmitResult(judgment, replayed=True, next_error=error)
    return SubmitResult(judgment, replayed=True, next_assignment=following)


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
    rng,
) -> SubmitResult:
    assignment, last_finished = _assignment_for_submit(assignment_id=assignment_id, user=user)
    project = assignment.project
    now = timezone.now()
    if assignment.status == Assignment.Status.SUBMITTED:
        raise _AlreadySubmitted
    _expire_if_overdue(assignment, now)
    if assignment.status == Assignment.Status.EXPIRED:
        raise Conflict(
            "The lease on this item expired; ask for the next item.", code="lease_expired"
        )
    if assignment.status == Assignment.Status.SKIPPED:
        raise Conflict("This assignment was skipped.", code="skipped")

    order = assignment.display_order
    fields = {}
    if project.task_kind == TaskKind.PAIRWISE:
        if choice is None or ranking is not None:
            raise ServiceError("A pairwise item takes a `choice` and no `ranking`.", code="choice")
        fields["choice"] = _pairwise_to_canonical(project=project, shown=choice, order=order)
        fields["shown_choice"] = choice
    else:
        if ranking is None or choice is not None:
            raise ServiceError("A ranking item takes a `ranking` and no `choice`.", code="ranking")
        fields["ranking"] = _ranking_to_canonical(project=project, ranks=ranking, order=order)
        fields["shown_choice"] = ",".join(str(r) for r in ranking)
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

    # Timed from when the item could be shown: its lease, or the annotator's last finish if
    # later (an item leased ahead in another project waits until the one before is done).
    started = max(assignment.leased_at, last_finished or assignment.leased_at)
    judgment = Judgment(
        project=project,
        item_id=assignment.item_id,
        assignment=assignment,
        annotator=user,
        strength=strength,
        confidence=confidence,
        rationale=rationale,
        time_spent_ms=time_spent_ms,
        server_time_ms=max(0, round((now - started).total_seconds() * 1000)),
        idempotency_key=idempotency_key,
        source=source,
        is_gold=assignment.kind == Assignment.Kind.GOLD,
        is_repeat=assignment.kind == Assignment.Kind.REPEAT,
        **fields,
    )
    membership = _judgment_record(judgment=judgment, assignment=assignment, user=user, now=now)
    # Quality control runs in a Celery task every N judgments; the submit only counts.
    # `seq` is the annotator's count when this item was served, so this is their count now
    # give or take judgments submitted meanwhile: close enough to space the checks.
    count = assignment.seq + 1
    project_id, user_id = project.pk, user.pk
    transaction.on_commit(
        lambda: hooks.judgment_submitted(
            project_id=project_id, annotator_id=user_id, judgment_count=count
        ),
        robust=True,
    )
    if not serve_next or membership is None:
        return SubmitResult(judgment, replayed=False)
    # The same transaction serves the next item: the membership row is locked by the update
    # above, as `next` locks it, and the lease just submitted was the annotator's only one
    # in this project (a database constraint), so there is no live lease to look up.
    try:
        following = _serve_next(membership=membership, user=user, rng=rng, live_possible=False)
    except ServiceError as error:
        # Paused, or the skip budget is spent: the judgment stands, no item comes with it.
        return SubmitResult(judgment, replayed=False, next_error=error)
    return SubmitResult(judgment, replayed=False, next_assignment=following)


def _judgment_record(*, judgment: Judgment, assignment: Assignment, user, now) -> Membership | None:
    """Store the judgment, finish its assignment, count it on the item and the membership.

    Hand-written statements (annotation/sql.py): compiling them with the ORM cost more CPU
    than the rest of the submit. On PostgreSQL the four writes are one statement (data-
    modifying CTEs), one round trip instead of four. Return the membership, now locked.
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
        return _membership_count_judgment(project=assignment.project, user=user, now=now)
    insert, insert_params = sql.insert_parts(judgment)
    found = sql.fetch_one(
        _judgment_record_sql(insert),
        [*insert_params, *finished, assignment.item_id, counts_done, *membership_params],
        Membership,
    )
    if found is None:  # no longer a member: the judgment stands all the same
        judgment.pk = Judgment.objects.filter(assignment_id=assignment.pk).values_list(
            "pk", flat=True
        )[0]
        membership = None
    else:
        membership, judgment.pk = found
        membership.project = assignment.project
    judgment._state.adding = False
    judgment._state.db = connection.alias
    return membership


@functools.cache
def _judgment_record_sql(insert: str) -> str:
    return (
        f"WITH j AS ({insert}), "
        f"a AS ({_finish_sql()}), "
        f'i AS (UPDATE "{Item._meta.db_table}" SET "n_done" = "n_done" + 1 '
        f'WHERE "id" = %s AND %s) '
        f"{_membership_count_sql('postgresql')}, (SELECT * FROM j)"
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


@transaction.atomic
def assignment_skip(*, assignment_id: int, user, reason: str) -> Assignment:
    """Give a leased item back with a reason; the annotator is not served it again."""
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError("A skip needs a reason.", code="reason")
    if len(reason) > 500:
        raise ServiceError("reason is longer than 500 characters.", code="reason")
    assignment = _assignment_for_update(assignment_id=assignment_id, user=user)
    if assignment.status == Assignment.Status.SKIPPED:
        return assignment
    if assignment.status != Assignment.Status.LEASED:
        raise Conflict(f"This assignment is {assignment.status}.", code=assignment.status)
    now = timezone.now()
    Assignment.objects.filter(pk=assignment.pk).update(
        status=Assignment.Status.SKIPPED, finished_at=now
    )
    Skip.objects.create(assignment=assignment, reason=reason)
    if assignment.kind != Assignment.Kind.REPEAT:
        _items_release(item_ids=[assignment.item_id])
    membership = (
        Membership.objects.select_for_update()
        .filter(project_id=assignment.project_id, user=user)
        .first()
    )
    if membership is not None:
        membership.skip_count += 1
        membership.skips_in_row += 1
        membership.last_finished_at = now
        fields = ["skip_count", "skips_in_row", "last_finished_at"]
        spent = _skip_budget_spent(membership=membership, project=assignment.project)
        if spent is not None and not membership.flagged:
            # The next `next` answers 429; the researchers see why on the QC page.
            membership.flagged = True
            membership.status_reason = f"Skip budget spent: {spent[1]}."
            fields += ["flagged", "status_reason"]
        membership.save(update_fields=fields)
    assignment.status = Assignment.Status.SKIPPED
    return assignment


@transaction.atomic
def assignment_heartbeat(*, assignment_id: int, user) -> Assignment:
    """Extend a live lease by the project's lease length."""
    assignment = _assignment_for_update(assignment_id=assignment_id, user=user)
    now = timezone.now()
    _expire_if_overdue(assignment, now)
    if assignment.status != Assignment.Status.LEASED:
        raise Conflict(
            "The lease on this item expired; ask for the next item."
            if assignment.status == Assignment.Status.EXPIRED
            else f"This assignment is {assignment.status}.",
            code="lease_expired" if assignment.status == "expired" else assignment.status,
        )
    assignment.lease_expires = now + timedelta(seconds=assignment.project.lease_seconds)
    Assignment.objects.filter(pk=assignment.pk).update(lease_expires=assignment.lease_expires)
    return assignment


def label_source_for(*, user) -> str:
    """Return the label source of a user's judgments: human unless a machine account."""
    known = getattr(user, "_prefloop_label_source", None)
    if known is not None:
        return known
    group = user.groups.filter(name__in=list(SOURCE_GROUPS)).values_list("name", flat=True)
    return user_label_source_remember(user=user, group=group.first())


def user_label_source_remember(*, user, group: str | None) -> str:
    """Note on this request's user object which label source its machine group gives."""
    user._prefloop_label_source = SOURCE_GROUPS[group] if group else LabelSource.HUMAN
    return user._prefloop_label_source


def simulated_annotator_ensure(
    *, project: Project, username: str, source: str = LabelSource.SIMULATED
) -> str:
    """Create (or reuse) a machine annotator in a project and return a fresh API token."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from annotation.accounts import token_issue

    group_name = next(g for g, s in SOURCE_GROUPS.items() if s == source)
    user, created = get_user_model().objects.get_or_create(username=username)
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    user.groups.add(Group.objects.get_or_create(name=group_name)[0])
    Membership.objects.get_or_create(project=project, user=user)
    # A new token per run: machine tokens do not expire, so none outlives its run.
    return token_issue(user=user, fresh=True).key


def membership_set(*, project: Project, user, role: str = Membership.Role.ANNOTATOR) -> Membership:
    """Add a user to a project with a role, or change their role."""
    if role not in Membership.Role.values:
        raise ServiceError(f"role must be one of {', '.join(Membership.Role.values)}.", code="role")
    membership, _ = Membership.objects.update_or_create(
        project=project, user=user, defaults={"role": role}
    )
    return membership


def membership_set_status(
    *, membership: Membership, status: str, reason: str = "", flagged: bool | None = None
) -> Membership:
    """Pause or resume an annotator; paused annotators are not served."""
    membership.status = status
    membership.status_reason = reason
    if flagged is not None:
        membership.flagged = flagged
    membership.save(update_fields=["status", "status_reason", "flagged"])
    return membership


@transaction.atomic
def round_create(*, project: Project, model_version=None, source_key: str = "") -> Round:
    """Open the project's next round; with a source key, return the round it already made."""
    if source_key:
        existing = Round.objects.filter(project=project, source_key=source_key).first()
        if existing is not None:
            return existing
    Project.objects.select_for_update().filter(pk=project.pk).first()
    last = Round.objects.filter(project=project).order_by("-number").first()
    return Round.objects.create(
        project=project,
        number=(last.number + 1) if last else 1,
        model_version=model_version,
        source_key=source_key,
    )


def round_close(*, round_: Round) -> Round:
    """Stop serving a round's items."""
    round_.status = Round.Status.CLOSED
    round_.closed_at = timezone.now()
    round_.save(update_fields=["status", "closed_at"])
    return round_


def assignment_expire(*, assignment: Assignment, now=None) -> None:
    """End a live lease (e.g. when QC pauses its annotator); a second call changes nothing."""
    _assignment_expire(assignment, now or timezone.now())
