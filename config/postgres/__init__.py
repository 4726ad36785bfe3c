"""Django's PostgreSQL backend with a health check that needs no round trip (see `base`)."""


def use_for(database: dict) -> dict:
    """Return a DATABASES entry with this backend in place of Django's PostgreSQL one."""
    if database.get("ENGINE") == "django.db.backends.postgresql":
        database["ENGINE"] = "config.postgres"
    return database
