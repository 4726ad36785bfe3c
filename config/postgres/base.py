"""Django's PostgreSQL backend with a health check that costs no round trip on a quiet link,
and generic plans for the prepared serving statements.

With `CONN_HEALTH_CHECKS`, Django checks a persistent connection at the first query of every
request by sending `SELECT 1`: a round trip to PostgreSQL per request, as many as the
annotator's submit itself makes to store the judgment. A connection PostgreSQL has ended
(`pg_terminate_backend`, a restart, a failover) is not silent: the server sends its error
and closes the socket, and psycopg marks a connection it saw fail as broken. So the check
here asks the operating system first whether the socket has anything to read, which it never
has between requests on a healthy connection (the protocol only answers queries); only then,
or when psycopg saw it fail, is `SELECT 1` sent, as Django does. A link that dies without a
word (a cable, a firewall dropping state) looks healthy to both checks until a query times
out, and then fails as a retryable 503 (`annotation.apis.exception_handler`).

The serving statements are prepared once per connection (`annotation/sql.py`), but PostgreSQL
plans a prepared statement afresh on each of its first five executions on a connection
("custom plans") before it settles on a generic one. Planning a claim costs PostgreSQL about
twice as long as running it, and the gold and repeat claims, drawn for about one item in
twenty, rarely reach a sixth execution on any connection: they were planned on every call,
and so took longer to serve than primary items (a timing tell). Each new connection is set to
use the generic plan from the first execution (`plan_cache_mode`; it only concerns prepared
statements, which no other query uses); those plans are the ones
`tests/annotation/test_serving_plans.py` holds to a bounded number of rows.
"""

import select

from django.conf import settings
from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
    def init_connection_state(self):
        super().init_connection_state()
        if self.connection is not None and settings.SERVING_PREPARED_STATEMENTS:
            with self.connection.cursor() as cursor:
                cursor.execute("SET plan_cache_mode = force_generic_plan")
            if not self.get_autocommit():
                self.connection.commit()

    def is_usable(self):
        conn = self.connection
        if conn is None or conn.closed or conn.broken:
            return False
        try:
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
            quiet = not poller.poll(0)
        except (OSError, ValueError):
            return False
        return quiet or super().is_usable()
