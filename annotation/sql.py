"""Hand-written reads of the serving hot path (next, submit, heartbeat, skip).

The ORM compiles a queryset anew on every call, and on the serving path compiling cost more
CPU than everything else a request does (issue #2 sets a budget of 12 ms of server CPU per
judgment). The few statements run on every request are therefore written out once per
database vendor, and their rows are turned into ordinary model instances with the same
converters the ORM would apply, so the code around them sees the usual objects.
`tests/annotation/test_auth.py` pins how many statements a request makes, and the
concurrency tests hold the locking statements to their contracts.

Each plain SELECT written out here was timed against the ORM query sending the same
statement (`benchmarks/serving_sql_bench.py`): the ORM adds 0.8 to 1.6 ms of CPU per call,
more than the hand-written statement costs in all, so none of them went back to the ORM.

On PostgreSQL these statements are also prepared, once per connection: planning them cost
PostgreSQL more than running them (0.8 ms against 0.25 ms for the item payload on a 2-core
machine), on every call. Django leaves prepared statements off for every other query so that
connection poolers keep working; a pooler in transaction mode needs protocol-level prepared
statements (PgBouncer 1.21 and later, `max_prepared_statements`), or
`SERVING_PREPARED_STATEMENTS=0` in the environment.
"""

import functools

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections


@functools.cache
def _fields(model) -> tuple:
    return tuple(model._meta.concrete_fields)


def columns(model, alias: str = "") -> str:
    """The model's columns, in field order, for a SELECT list: `a."id", a."item_id", ...`."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(f'{prefix}"{field.column}"' for field in _fields(model))


def lock(vendor: str, of: str = "", *, skip_locked: bool = False) -> str:
    """`FOR UPDATE [OF x] [SKIP LOCKED]` on PostgreSQL; nothing on SQLite, which serialises
    writers."""
    if vendor != "postgresql":
        return ""
    return f" FOR UPDATE{f' OF {of}' if of else ''}{' SKIP LOCKED' if skip_locked else ''}"


@functools.cache
def _converters(model, vendor: str) -> tuple:
    out = []
    for field in _fields(model):
        col = field.get_col(model._meta.db_table)
        converters = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        out.append((tuple(converters), col))
    return tuple(out)


def _instance(model, values, db):
    converted = []
    for (converters, col), value in zip(_converters(model, db.vendor), values, strict=True):
        for convert in converters:
            value = convert(value, col, db)
        converted.append(value)
    return model.from_db(db.alias, _attnames(model), converted)


@functools.cache
def _attnames(model) -> list[str]:
    return [f.attname for f in _fields(model)]


_NEVER_AUTOMATICALLY = 2**62


def _cursor(db):
    """A cursor whose statements PostgreSQL prepares on first use (server-side binding)."""
    if (
        db.vendor != "postgresql"
        or not settings.SERVING_PREPARED_STATEMENTS
        # Logged (DEBUG, a test capturing queries): Django's log shows the SQL of client-side
        # binding only, so a logged statement is sent unprepared, with the same text.
        or db.queries_logged
    ):
        return db.cursor()
    db.close_if_health_check_failed()  # as Django's own cursors do (CONN_HEALTH_CHECKS)
    db.ensure_connection()
    db.validate_thread_sharing()
    driver = db.connection
    if driver.prepare_threshold is None:
        # Django leaves psycopg's threshold unset, which refuses even an explicit `prepare`;
        # one never reached keeps every other query unprepared, as Django wants.
        driver.prepare_threshold = _NEVER_AUTOMATICALLY
    return db.make_cursor(_prepared_cursor_class()(driver))


@functools.cache
def _prepared_cursor_class():
    from django.db.backends.postgresql.base import ServerBindingCursor

    class PreparedCursor(ServerBindingCursor):
        def execute(self, query, params=None, *, prepare=None, binary=None):
            return super().execute(query, params, prepare=prepare is not False, binary=binary)

    return PreparedCursor


def fetch_value(sql: str, params: list):
    """Run `sql` and return the first column of its first row, or None."""
    with _cursor(connections[DEFAULT_DB_ALIAS]) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else row[0]


def fetch_one(sql: str, params: list, *models) -> tuple | None:
    """Run `sql` (whose SELECT list is `columns(m)` for each model in turn) and build the
    first row's instances, one per model; None when there is no row.

    Columns after the models' are appended to the tuple as the driver returned them (see
    `field_value`)."""
    db = connections[DEFAULT_DB_ALIAS]  # one lookup: the `connection` proxy costs one per use
    with _cursor(db) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    instances, start = [], 0
    for model in models:
        width = len(_fields(model))
        instances.append(_instance(model, row[start : start + width], db))
        start += width
    return (*instances, *row[start:])


def field_value(model, name: str, value):
    """Convert a raw column value of `model.name` as the ORM would (e.g. SQLite datetimes)."""
    field = model._meta.get_field(name)
    col = field.get_col(model._meta.db_table)
    for convert in connection.ops.get_db_converters(col) + field.get_db_converters(connection):
        value = convert(value, col, connection)
    return value


def execute(sql: str, params: list) -> int:
    """Run a write statement; return how many rows it changed."""
    with _cursor(connections[DEFAULT_DB_ALIAS]) as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def fetch_all(sql: str, params: list) -> list[tuple]:
    """Run `sql` and return its rows as the driver returned them."""
    with _cursor(connections[DEFAULT_DB_ALIAS]) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


@functools.cache
def _insert_sql(model, vendor: str) -> tuple[str, tuple]:
    fields = tuple(f for f in _fields(model) if not f.primary_key)
    columns_ = ", ".join(f'"{f.column}"' for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    statement = (
        f'INSERT INTO "{model._meta.db_table}" ({columns_}) VALUES ({marks}) '
        f'RETURNING "{model._meta.pk.column}"'
    )
    return statement, fields


def insert_parts(obj) -> tuple[str, list]:
    """Return `INSERT ... RETURNING pk` for a new instance and its parameters."""
    db = connections[DEFAULT_DB_ALIAS]
    statement, fields = _insert_sql(type(obj), db.vendor)
    return statement, [f.get_db_prep_save(f.pre_save(obj, True), db) for f in fields]


def insert_select_parts(obj, *, values: dict) -> tuple[str, list]:
    """Return `INSERT INTO t (...) SELECT ...` (to be followed by `FROM ...`) for a new
    instance whose fields named in `values` take those SQL expressions, and the other fields'
    params."""
    db = connections[DEFAULT_DB_ALIAS]
    statement, fields = _insert_select_sql(type(obj), tuple(values.items()), db.vendor)
    params = [f.get_db_prep_save(f.pre_save(obj, True), db) for f in fields if f.name not in values]
    return statement, params


@functools.cache
def _insert_select_sql(model, values: tuple, vendor: str) -> tuple[str, tuple]:
    fields = tuple(f for f in _fields(model) if not f.primary_key)
    columns_ = ", ".join(f'"{f.column}"' for f in fields)
    given = dict(values)
    selected = ", ".join(given.get(f.name, "%s") for f in fields)
    return f'INSERT INTO "{model._meta.db_table}" ({columns_}) SELECT {selected}', fields


def insert(obj):
    """Insert a new instance in one prepared statement, as `save()` would; return it.

    The fields' own `pre_save` (auto_now_add) and `get_db_prep_save` (JSON, datetimes) make
    the values; no signals are sent (the serving models have no receivers).
    """
    statement, params = insert_parts(obj)
    obj.pk = fetch_value(statement, params)
    obj._state.adding = False
    obj._state.db = connection.alias
    return obj
