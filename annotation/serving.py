"""Serving: claim the next item for an annotator, keep and end leases, take skips.

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

Prefetch: the annotator page may hold one more item under its own lease (`ahead`) beside the
current one, so the next item is on screen the moment the current one is answered. A database
constraint allows one live lease per annotator, project and `ahead`, so never a third; the
held item is claimed by the same statements as any other (the same blindness rules), renewed
by its own heartbeat, expires like any lease, and becomes the current item when `next` (or a
submit asking for the next item) finds no current one. A skip that spends the skip budget gives
the held item back, so it is not served past the budget.
"""

import functools
import hashlib
import hmac
import random
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from annotation import sql
from annotation.errors import Conflict, Forbidden, NotFound, ServiceError, SkipBudgetSpent
from annotation.models import (
    Assignment,
    Candidate,
    Item,
    ItemCandidate,
    Membership,
    Project,
    Prompt,
    Round,
    Skip,
)

EXPIRY_BATCH = 100
# The claim shuffles (per annotator) the this-many least-filled items it could serve, in
# (n_taken, id) order: shuffling every open item costs a sort of the whole round per request
# (60 ms at 20k items against 0.1 ms), and a window this wide already keeps concurrent
# annotators apart.
SHUFFLE_WINDOW = 64


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
        locked_with_project_sql(model, where, connection.vendor), params, model, Project
    )
    if found is None:
        return None
    row, row.project = found
    return row


@functools.cache
def locked_with_project_sql(model, where: str, vendor: str, extra: str = "") -> str:
    return (
        f"SELECT {sql.columns(model, 'x')}, {sql.columns(Project, 'p')}{extra} "
        f'FROM "{model._meta.db_table}" x JOIN "{Project._meta.db_table}" p '
        f'ON p."id" = x."project_id" WHERE {where}{sql.lock(vendor, "x")}'
    )


# Overdue leases are given back by a sweep once every this many claims per project and
# server process, and whenever a claim finds nothing: run on every claim, the sweep was one
# statement in five of a submit that returns the next item. An item whose lease ran out
# comes back a few claims later than its lease says (it still counts as taken meanwhile, so
# the least-filled items are served first), and never later than when nothing else is left.
LEASE_SWEEP_EVERY = 16
_claims_seen: dict[int, int] = {}


def _leases_expire_if_due(*, project_id: int, now) -> None:
    seen = _claims_seen.get(project_id, 0)
    _claims_seen[project_id] = seen + 1
    if seen % LEASE_SWEEP_EVERY == 0:
        leases_expire(project_id=project_id, now=now)


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
    # Run every few claims: written out once (see annotation/sql.py).
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


@functools.cache
def payload_sql(item_ref: str) -> str:
    """What an annotator may see of the item `item_ref` (a placeholder or a column): one row
    per candidate, (position, text, prompt text, prompt messages)."""
    return (
        f'SELECT ic."position", c."text", p."text", p."messages" '
        f'FROM "{ItemCandidate._meta.db_table}" ic '
        f'JOIN "{Candidate._meta.db_table}" c ON c."id" = ic."candidate_id" '
        f'JOIN "{Item._meta.db_table}" i ON i."id" = ic."item_id" '
        f'JOIN "{Prompt._meta.db_table}" p ON p."id" = i."prompt_id" '
        f'WHERE ic."item_id" = {item_ref}'
    )


def _serving_salt(user_id: int) -> str:
    """Return the annotator's key for the serving order: stable, and not guessable by others."""
    key = settings.SECRET_KEY.encode()
    return hmac.new(key, f"serving-order:{user_id}".encode(), hashlib.sha256).hexdigest()[:16]


def _primary_params(*, project: Project, user_id: int) -> list:
    """Parameters of `_primary_open_sql`, in order."""
    return [
        project.pk,
        Round.Status.OPEN,
        project.overlap,
        user_id,
        project.pk,
        Assignment.Status.EXPIRED,
        Assignment.Kind.REPEAT,
    ]


def _primary_open_sql(alias: str) -> str:
    """FROM/WHERE of the open primary items this annotator has not had (`_primary_params`).

    The items they had are excluded with NOT IN over one read of their assignments in the
    project, which PostgreSQL runs once per statement and hashes (a "hashed SubPlan"): the
    cost is one pass over their history, whatever the plan's statistics say. As NOT EXISTS,
    misled by statistics taken before the annotator had any assignment (a new project; a
    prepared statement's generic plan, made in its first seconds and kept), PostgreSQL ran
    it as a nested-loop join over their whole history once per candidate item (3.3 ms at 300
    judgments), or scanned the whole table once per candidate item. Pinned by
    tests/annotation/test_serving_plans.py. (`item_id` is never NULL, so NOT IN is exact.
    PostgreSQL hashes the read while it fits in `work_mem`: at the default 4 MB, some
    hundred thousand assignments of one annotator in one project.)
    """
    items, rounds = Item._meta.db_table, Round._meta.db_table
    assignments = Assignment._meta.db_table
    return f"""
        FROM "{items}" {alias} JOIN "{rounds}" {alias}r ON {alias}r."id" = {alias}."round_id"
        WHERE {alias}."project_id" = %s AND NOT {alias}."is_gold"
          AND {alias}r."status" = %s AND {alias}."n_taken" < %s
          AND {alias}."id" NOT IN (
              SELECT {alias}a."item_id" FROM "{assignments}" {alias}a
              WHERE {alias}a."annotator_id" = %s AND {alias}a."project_id" = %s
                AND {alias}a."status" <> %s AND {alias}a."kind" <> %s
          )
    """


def _claim_primary(*, project: Project, user) -> Item | None:
    """Claim a least-served open item this annotator has not had, and count it taken.

    One statement, the hottest of the serving path: the first subquery takes the
    `SHUFFLE_WINDOW` least-filled items the annotator may have (as an array, so they are read
    by primary key rather than by a scan of the project's items) and locks the first of them
    in the annotator's own order (`FOR UPDATE ... SKIP LOCKED` re-checks `n_taken < overlap`
    on the newest row version, so a row a concurrent claim filled is passed over); only when
    every one of them was taken meanwhile does the second, unshuffled one run. The outer
    UPDATE bumps the row.
    """
    primary = _primary_params(project=project, user_id=user.pk)
    item_id = sql.fetch_value(
        _claim_primary_sql(connection.vendor),
        [*primary, project.overlap, _serving_salt(user.pk), *primary],
    )
    return None if item_id is None else Item(pk=item_id)


@functools.cache
def _claim_primary_sql(vendor: str) -> str:
    items = Item._meta.db_table
    # PostgreSQL reads the window by primary key as an array; SQLite has no arrays.
    window_open, window_close = ("= ANY(ARRAY", ")") if vendor == "postgresql" else ("IN", "")
    return f"""
        UPDATE "{items}" SET "n_taken" = "n_taken" + 1
        WHERE "id" = COALESCE(
            (
                SELECT i."id" FROM "{items}" i
                WHERE i."id" {window_open} (
                    SELECT w."id" {_primary_open_sql("w")}
                    ORDER BY w."n_taken", w."id" LIMIT {SHUFFLE_WINDOW}
                ){window_close} AND i."n_taken" < %s
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


def _claim_leased(assignment: Assignment, *, claim: str, params: list, values: dict) -> bool:
    """Run `claim` (a statement whose rows are the claimed item, as `c`) and insert `assignment`
    with the columns `values` (field name -> SQL over `c`) for it, in one statement that also
    reads the item's payload (PostgreSQL: three round trips in one). False when nothing was
    claimed."""
    insert, insert_params = sql.insert_select_parts(assignment, values=values)
    rows = sql.fetch_all(_claim_leased_sql(claim, insert), [*params, *insert_params])
    if not rows:
        return False
    assignment.pk, assignment.item_id, assignment.repeat_of_id, order = rows[0][:4]
    assignment.display_order = sql.field_value(Assignment, "display_order", order)
    assignment._state.adding = False
    assignment._state.db = connection.alias
    assignment.payload_rows = [row[4:] for row in rows if row[4] is not None]
    return True


_LEASED_ITEM = 'a."item_id"'
_CLAIMED_ITEM = {"item": 'c."id"'}


@functools.cache
def _claim_leased_sql(claim: str, insert: str) -> str:
    repeat_of = Assignment._meta.get_field("repeat_of").column
    return (
        f"WITH c AS ({claim}), "
        f'a AS ({insert} FROM c RETURNING "id", "item_id", "{repeat_of}", "display_order") '
        f'SELECT a."id", a."item_id", a."{repeat_of}", a."display_order", x.* '
        f"FROM a LEFT JOIN LATERAL ({payload_sql(_LEASED_ITEM)}) x ON TRUE"
    )


def _claim_primary_leased(assignment: Assignment, *, project: Project, user) -> bool:
    """Claim a primary item as `_claim_primary` does and lease it (`_claim_leased`)."""
    primary = _primary_params(project=project, user_id=user.pk)
    return _claim_leased(
        assignment,
        claim=_claim_primary_sql("postgresql"),
        params=[*primary, project.overlap, _serving_salt(user.pk), *primary],
        values=_CLAIMED_ITEM,
    )


def _claim_gold_params(*, project: Project, user) -> list:
    return [
        project.pk,
        Round.Status.OPEN,
        user.pk,
        project.pk,
        Assignment.Status.EXPIRED,
        *_primary_params(project=project, user_id=user.pk),
        _serving_salt(user.pk),
    ]


def _claim_gold(*, project: Project, user) -> Item | None:
    """Claim a gold item the annotator has not had, only while primary work remains for them."""
    item_id = sql.fetch_value(_claim_gold_sql(), _claim_gold_params(project=project, user=user))
    return None if item_id is None else Item(pk=item_id)


def _claim_gold_leased(assignment: Assignment, *, project: Project, user) -> bool:
    """Claim a gold item as `_claim_gold` does and lease it (`_claim_leased`)."""
    return _claim_leased(
        assignment,
        claim=_claim_gold_sql(),
        params=_claim_gold_params(project=project, user=user),
        values=_CLAIMED_ITEM,
    )


@functools.cache
def _claim_gold_sql() -> str:
    items, rounds = Item._meta.db_table, Round._meta.db_table
    assignments = Assignment._meta.db_table
    # Gold has no overlap cap, so nothing to skip or re-check: the UPDATE's row lock suffices.
    # The gold they had: one hashed read of their assignments, as in `_primary_open_sql`.
    return f"""
        UPDATE "{items}" SET "n_taken" = "n_taken" + 1
        WHERE "id" = (
            SELECT g."id" FROM "{items}" g JOIN "{rounds}" gr ON gr."id" = g."round_id"
            WHERE g."project_id" = %s AND g."is_gold" AND gr."status" = %s
              AND g."id" NOT IN (
                  SELECT ga."item_id" FROM "{assignments}" ga
                  WHERE ga."annotator_id" = %s AND ga."project_id" = %s AND ga."status" <> %s
              )
              AND EXISTS (SELECT 1 {_primary_open_sql("w")})
            ORDER BY MD5(CAST(g."id" AS TEXT) || %s)
            LIMIT 1
        )
        RETURNING "id"
    """


def _claim_repeat_params(membership: Membership) -> list | None:
    """Parameters of `_claim_repeat_sql`; None while the annotator has too few judgments."""
    project = membership.project
    latest_seq = membership.judgment_count - project.repeat_min_gap
    if latest_seq < 0:
        return None
    one = [
        project.pk,
        membership.user_id,
        Assignment.Kind.PRIMARY,
        Assignment.Status.SUBMITTED,
        latest_seq,
        membership.user_id,
        project.pk,
        Assignment.Status.EXPIRED,
        Round.Status.OPEN,
        *_primary_params(project=project, user_id=membership.user_id),
    ]
    # The windowed claim, then the same over the whole history (`_claim_repeat_sql`).
    return one + one


def _claim_repeat(*, membership: Membership) -> Assignment | None:
    """Pick a submitted primary item to show again, only while primary work remains."""
    params = _claim_repeat_params(membership)
    if params is None:
        return None
    found = sql.fetch_one(_claim_repeat_sql(sql.columns(Assignment, "a")), params, Assignment)
    return None if found is None else found[0]


# The repeated assignment's item, its id, and its display order reversed (the same candidates
# with the sides flipped), as the rows `_claim_leased` inserts from.
_REPEAT_CLAIMED = (
    'a."item_id" AS "item_id", a."id" AS "repeat_of", '
    '(SELECT jsonb_agg(o."v" ORDER BY o."n" DESC) '
    'FROM jsonb_array_elements(a."display_order") WITH ORDINALITY o("v", "n")) AS "display_order"'
)


def _claim_repeat_leased(assignment: Assignment, *, membership: Membership) -> bool:
    """Pick a repeat as `_claim_repeat` does and lease it, sides flipped (`_claim_leased`)."""
    params = _claim_repeat_params(membership)
    if params is None:
        return False
    return _claim_leased(
        assignment,
        claim=_claim_repeat_sql(_REPEAT_CLAIMED),
        params=params,
        values={
            "item": 'c."item_id"',
            "repeat_of": 'c."repeat_of"',
            "display_order": 'c."display_order"',
        },
    )


# How many of the annotator's earliest eligible items a repeat claim joins with their rounds
# before it looks further (only when none of them is in an open round).
REPEAT_WINDOW = 16


@functools.cache
def _claim_repeat_sql(select_list: str) -> str:
    # Drawn for about one item in twenty: written out, as the ORM took longer to compile
    # this query than the whole rest of the request (a tail on every 20th item). The items
    # already repeated are excluded with one hashed read of the annotator's repeats (by
    # their own partial index), as in `_primary_open_sql`: as NOT EXISTS, planned on
    # statistics from before the annotator had any assignment, PostgreSQL scanned the
    # assignment table once per earlier item (120 ms at 500 judgments). The earliest
    # eligible items are taken without their rounds first (`REPEAT_WINDOW` of
    # them) and only those are looked up in item and round: as one join, planned on such
    # statistics, PostgreSQL joined every eligible item of the annotator's history and
    # sorted them all (a repeat took 2.7 ms of PostgreSQL at 1,400 judgments against 0.8 ms
    # for a primary item, and 0.7 ms at their start: a timing tell). The second part, the
    # whole history, runs only when the first finds nothing.
    items, rounds = Item._meta.db_table, Round._meta.db_table
    assignments = Assignment._meta.db_table
    repeat_of = Assignment._meta.get_field("repeat_of").column
    # The kind written out, not a parameter: a generic plan can use the partial index of
    # the annotator's repeats (`assignment_user_repeats_idx`) only for a constant.
    repeat = Assignment.Kind.REPEAT.value

    def eligible(alias: str) -> str:
        return f"""
            {alias}."project_id" = %s AND {alias}."annotator_id" = %s AND {alias}."kind" = %s
            AND {alias}."status" = %s AND {alias}."seq" <= %s
            AND {alias}."id" NOT IN (
                SELECT x."{repeat_of}" FROM "{assignments}" x
                WHERE x."annotator_id" = %s AND x."project_id" = %s AND x."kind" = '{repeat}'
                  AND x."status" <> %s AND x."{repeat_of}" IS NOT NULL
            )"""

    primary_open = _primary_open_sql("w")
    whole = f"""
        SELECT {select_list} FROM "{assignments}" a
        JOIN "{items}" ai ON ai."id" = a."item_id"
        JOIN "{rounds}" ar ON ar."id" = ai."round_id"
        WHERE {eligible("a")} AND ar."status" = %s AND EXISTS (SELECT 1 {primary_open})
        ORDER BY a."seq" LIMIT 1"""
    # The window is read once, and each of its rows' round looked up by its item's primary
    # key in a subquery run per row: as a join, planned on such statistics, PostgreSQL
    # re-read the window once per assignment of the annotator, or found each row's
    # assignment through the item index.
    windowed = f"""
        SELECT {select_list} FROM (
            SELECT e.* FROM "{assignments}" e WHERE {eligible("e")}
            ORDER BY e."seq" LIMIT {REPEAT_WINDOW}
        ) a
        WHERE (
            SELECT ar."status" FROM "{items}" ai JOIN "{rounds}" ar ON ar."id" = ai."round_id"
            WHERE ai."id" = a."item_id"
        ) = %s AND EXISTS (SELECT 1 {primary_open})
        ORDER BY a."seq" LIMIT 1"""
    return f"SELECT * FROM ({windowed}) r1 UNION ALL SELECT * FROM ({whole}) r2 LIMIT 1"


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
    return serve_for_membership(membership=membership, user=user, rng=rng or random.Random())


@transaction.atomic
def assignment_prefetch(
    *, project_id: int, user, rng: random.Random | None = None
) -> Assignment | None:
    """Return the item held ahead for the annotator, or claim one; None when nothing is left."""
    membership = _membership_for_update(project_id=project_id, user=user)
    return serve_for_membership(
        membership=membership, user=user, rng=rng or random.Random(), ahead=True
    )


def _lease(assignment: Assignment, claim_leased, claim, **where) -> bool:
    """Claim an item and insert `assignment` for it: on PostgreSQL in one statement
    (`claim_leased`), elsewhere a claim (`claim`, returning the item or None) then an insert."""
    if connection.vendor == "postgresql":
        return claim_leased(assignment, **where)
    item = claim(**where)
    if item is None:
        return False
    assignment.item_id = item.pk
    sql.insert(assignment)
    return True


def serve_for_membership(
    *,
    membership: Membership,
    user,
    rng: random.Random,
    live_possible: bool = True,
    ahead: bool = False,
) -> Assignment | None:
    """Serve the annotator of a locked membership their live lease or a new claim.

    The current item is the live lease not held ahead, else the one held ahead (which then
    becomes current); with `ahead` it is the lease held ahead, or a new claim held ahead.
    """
    # `live_possible=False` saves the lease lookup when the caller knows there is none.
    project = membership.project
    if project.archived:
        raise NotFound("No such project.")
    if membership.status != Membership.Status.ACTIVE:
        raise Forbidden("Your annotation in this project is paused.", code="paused")
    now = timezone.now()
    lease_until = now + timedelta(seconds=project.lease_seconds)

    live = (
        _live_assignment(project_id=project.pk, user=user, ahead=ahead) if live_possible else None
    )
    if live is not None:
        if live.lease_expires >= now:
            live.lease_expires = lease_until
            # A lease held ahead becomes the current one once asked for as the next item.
            live.ahead = ahead
            live.save(update_fields=["lease_expires", "ahead"])
            return live
        # The annotator's own lease ran out: release it before serving anew.
        _assignment_expire(live, now)
    spent = _skip_budget_spent(membership=membership, project=project)
    if spent is not None:
        raise SkipBudgetSpent(spent[0])
    _leases_expire_if_due(project_id=project.pk, now=now)

    # The kind is drawn first, whatever the annotator did before; gold and repeats are then
    # served only while primary work remains for them (see the module docstring). On
    # PostgreSQL every kind is claimed, leased and read by one statement, so no kind takes
    # longer to serve than another (annotators must not tell them apart by timing either).
    draw = rng.random()
    assignment = Assignment(
        project=project,
        annotator=user,
        kind=Assignment.Kind.PRIMARY,
        seq=membership.judgment_count,
        lease_expires=lease_until,
        ahead=ahead,
    )
    if project.gold_rate <= draw < project.gold_rate + project.repeat_rate:
        assignment.kind = Assignment.Kind.REPEAT
        if connection.vendor == "postgresql":
            # The display order comes from the repeated assignment (`_REPEAT_CLAIMED`).
            assignment.display_order = []
            if _claim_repeat_leased(assignment, membership=membership):
                return assignment
        else:
            repeat_of = _claim_repeat(membership=membership)
            if repeat_of is not None:
                assignment.repeat_of, assignment.item_id = repeat_of, repeat_of.item_id
                # Sides flipped: the same candidates, shown in the reverse order.
                assignment.display_order = list(reversed(repeat_of.display_order))
                return sql.insert(assignment)
        assignment.kind = Assignment.Kind.PRIMARY
    # A claim that finds nothing leaves the random stream as it was (seeded simulations
    # replay the same way whichever statement did the claim).
    unclaimed = rng.getstate()
    assignment.display_order = _display_order(project.k, rng)
    if draw < project.gold_rate:
        assignment.kind = Assignment.Kind.GOLD
        if _lease(assignment, _claim_gold_leased, _claim_gold, project=project, user=user):
            return assignment
        assignment.kind = Assignment.Kind.PRIMARY
    # Nothing to claim may only mean leases ran out since the last sweep: sweep, try again.
    for last_try in (False, True):
        if _lease(assignment, _claim_primary_leased, _claim_primary, project=project, user=user):
            return assignment
        if last_try or not leases_expire(project_id=project.pk, now=now):
            rng.setstate(unclaimed)
            return None
    return None


def _assignment_for_update(*, assignment_id: int, user) -> Assignment:
    assignment = _locked_with_project(
        Assignment, where='x."id" = %s AND x."annotator_id" = %s', params=[assignment_id, user.pk]
    )
    if assignment is None:
        raise NotFound("No such assignment.")
    return assignment


def _live_assignment(*, project_id: int, user, ahead: bool = False) -> Assignment | None:
    """The annotator's current leased assignment in a project, else the one held ahead (at
    most one of each: a DB constraint); with `ahead`, only the one held ahead."""
    found = sql.fetch_one(
        _live_sql(ahead), [project_id, user.pk, Assignment.Status.LEASED], Assignment
    )
    return found[0] if found else None


_AHEAD_ONLY = 'AND a."ahead" '


@functools.cache
def _live_sql(ahead: bool) -> str:
    return (
        f'SELECT {sql.columns(Assignment, "a")} FROM "{Assignment._meta.db_table}" a '
        f'WHERE a."project_id" = %s AND a."annotator_id" = %s AND a."status" = %s '
        f"{_AHEAD_ONLY if ahead else ''}"
        f'ORDER BY a."ahead", a."id" DESC LIMIT 1'
    )


def _assignment_expire(assignment: Assignment, now) -> None:
    """Expire a lease once: only the caller whose update moved it off LEASED releases the item."""
    moved = Assignment.objects.filter(pk=assignment.pk, status=Assignment.Status.LEASED).update(
        status=Assignment.Status.EXPIRED, finished_at=now
    )
    if moved and assignment.kind != Assignment.Kind.REPEAT:
        _items_release(item_ids=[assignment.item_id])
    assignment.status = Assignment.Status.EXPIRED


def expire_if_overdue(assignment: Assignment, now) -> None:
    if assignment.status == Assignment.Status.LEASED and assignment.lease_expires < now:
        _assignment_expire(assignment, now)


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
        held = (
            _live_assignment(project_id=assignment.project_id, user=user, ahead=True)
            if spent is not None
            else None
        )
        if held is not None:
            # The item held ahead would be served next, past the budget: it goes back.
            _assignment_expire(held, now)
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
    expire_if_overdue(assignment, now)
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


@transaction.atomic
def assignment_release(*, assignment_id: int, user) -> Assignment:
    """Give back an item held ahead (the page was left); a second call changes nothing."""
    assignment = _assignment_for_update(assignment_id=assignment_id, user=user)
    if assignment.status == Assignment.Status.EXPIRED:
        return assignment
    if assignment.status != Assignment.Status.LEASED or not assignment.ahead:
        raise Conflict(
            "Only an item held ahead can be released; skip the current item instead.",
            code="not_ahead"
            if assignment.status == Assignment.Status.LEASED
            else assignment.status,
        )
    _assignment_expire(assignment, timezone.now())
    return assignment


def assignment_expire(*, assignment: Assignment, now=None) -> None:
    """End a live lease (e.g. when QC pauses its annotator); a second call changes nothing."""
    _assignment_expire(assignment, now or timezone.now())
