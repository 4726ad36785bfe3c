"""API token authentication in one query, which also tells whether the caller is a machine.

Every annotation request authenticates, so this is the hottest query of the API. DRF's
`TokenAuthentication` builds an ORM query per request and the submit path then asked for
the caller's groups in a second one; here one raw statement reads the token, the user and
the machine group (`annotation.members.SOURCE_GROUPS`) together. The same statement tells
whether the token is older than `API_TOKEN_LIFETIME`: human accounts' tokens expire, machine
accounts get a fresh one per run (`simulated_annotator_ensure`).

Password logins (login page, admin, token endpoint) go through `LoginLockoutBackend`, which
refuses a username locked out by django-axes after repeated failures.
"""

import functools

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import connection
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token

from annotation import sql
from annotation.members import SOURCE_GROUPS, user_label_source_remember


@functools.cache
def _sql() -> str:
    user_model = get_user_model()
    users = user_model._meta.db_table
    pk = user_model._meta.pk.column
    memberships = user_model.groups.through._meta.db_table
    groups = Group._meta.db_table
    names = ", ".join(["%s"] * len(SOURCE_GROUPS))
    return (
        f'SELECT {sql.columns(user_model, "u")}, t."created", t."created" < %s, '
        f'(SELECT g."name" FROM "{groups}" g JOIN "{memberships}" ug '
        f'ON ug."group_id" = g."id" WHERE ug."user_id" = u."{pk}" AND g."name" IN ({names}) '
        f'ORDER BY g."name" LIMIT 1) '
        f'FROM "{Token._meta.db_table}" t JOIN "{users}" u ON u."{pk}" = t."user_id" '
        f'WHERE t."key" = %s'
    )


class TokenAuthentication(authentication.TokenAuthentication):
    """`Authorization: Token <key>`, as DRF's, answered with a single query."""

    def authenticate_credentials(self, key):
        cutoff = timezone.now() - settings.API_TOKEN_LIFETIME
        params = [connection.ops.adapt_datetimefield_value(cutoff), *SOURCE_GROUPS, key]
        found = sql.fetch_one(_sql(), params, get_user_model())
        if found is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        user, created, stale, machine_group = found
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        if stale and machine_group is None:
            raise exceptions.AuthenticationFailed(
                _("Token expired; log in at /api/auth/token/ for a new one.")
            )
        user_label_source_remember(user=user, group=machine_group)
        return user, Token(key=key, user=user, created=sql.field_value(Token, "created", created))


class LoginLockoutBackend(AxesStandaloneBackend):
    """Refuse password logins of a username locked out after repeated failures."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        # A login without a request (the test client's `login`, code run from a shell) has
        # no client address to count against; the web login forms and the token endpoint
        # always pass one.
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
