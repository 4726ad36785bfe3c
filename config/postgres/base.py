"""Django's PostgreSQL backend with a health check that costs no round trip on a quiet link.

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
"""

import select

from django.db.backends.postgresql import base


class DatabaseWrapper(base.DatabaseWrapper):
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
