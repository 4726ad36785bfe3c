"""WSGI entry point for gunicorn."""

import gc
import os

from django.core.wsgi import get_wsgi_application

# A server started without a settings module gets production settings, which refuse to load
# without a secret key, never the development settings with DEBUG on and a known key.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.production")
application = get_wsgi_application()


def warm_up() -> None:
    """Import, before the first request, what the first requests would import on the way.

    Every view module (through the URL patterns) and the broker client behind the QC checks
    that submits queue: loaded lazily, the Celery and Redis modules cost a worker's first
    queued check about 0.1 s (measured on a 2-core machine), holding the interpreter lock
    while its other threads serve. No connection is opened: a broker or a database down at
    start-up must not stop the web server.
    """
    from django.urls import get_resolver

    from config.celery import app

    get_resolver().url_patterns  # noqa: B018 - imports the URLconf and every view module
    import kombu.transport.redis  # noqa: F401 - the broker transport, loaded on first use

    app.amqp  # noqa: B018 - builds the task router and message producer classes
    app.producer_pool  # noqa: B018 - the producer pool (its connections open on first use)


warm_up()
# Everything loaded so far lives as long as the process: moved out of the collector's reach
# (gc.freeze, meant for servers like this one), a full collection walks only the objects
# created since, not the hundreds of thousands that make Django and the app.
gc.collect()
gc.freeze()
