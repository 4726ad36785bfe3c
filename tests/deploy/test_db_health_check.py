"""The database health check: nothing sent on a quiet connection, a dropped one caught."""

import time

import psycopg
import pytest
from django.db import connections

pytestmark = pytest.mark.django_db(transaction=True)


def _last_query(pid: int, dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as watcher:
        row = watcher.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return row[0] if row else ""


@pytest.fixture
def own_connection():
    """A second connection to the test database, as a worker thread of the web server has."""
    wrapper = connections.create_connection("default")
    wrapper.ensure_connection()
    yield wrapper
    wrapper.close()


def _dsn(wrapper) -> str:
    params = wrapper.get_connection_params()
    return f"host={params['host']} port={params['port']} user={params['user']} dbname=postgres"


def test_a_quiet_connection_is_checked_without_a_query(own_connection):
    with own_connection.cursor() as cursor:
        cursor.execute("SELECT 'the last query before the check'")
    pid = own_connection.connection.info.backend_pid

    assert own_connection.is_usable()

    # PostgreSQL saw no query since: the check asked only the operating system.
    assert _last_query(pid, _dsn(own_connection)) == "SELECT 'the last query before the check'"


def test_a_connection_the_server_ended_fails_the_check_and_the_next_query_reconnects(
    own_connection,
):
    pid = own_connection.connection.info.backend_pid
    with psycopg.connect(_dsn(own_connection), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 10
    while _last_query(pid, _dsn(own_connection)) and time.monotonic() < deadline:
        time.sleep(0.05)

    assert not own_connection.is_usable()

    # As at the start of a request: a failed check closes the connection, the query gets a
    # new one instead of an error.
    own_connection.health_check_enabled, own_connection.health_check_done = True, False
    with own_connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        assert cursor.fetchone()[0] != pid
