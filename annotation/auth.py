"""API token authentication in one query, which also tells whether the caller is a machine.

Every annotation request authenticates, so this is the hottest query of the API. DRF's
`TokenAuthentication` builds an ORM query per request and the submit path then asked for
the caller's groups in a second one; here one raw statement reads the token, the user and
the machine group (`annotation.services.SOURCE_GROUPS`) together.
"""

import functools

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token

from annotation.services import SOURCE_GROUPS, user_label_source_remember


@functools.cache
def _sql() -> str:
    user_model = get_user_model()
    users = user_model._meta.db_table
    pk = user_model._meta.pk.column
    memberships = user_model.groups.through._meta.db_table
    groups = Group._meta.db_table
    names = ", ".join(["%s"] * len(SOURCE_GROUPS))
    return (
        f'SELECT u.*, t."created" AS "_token_created", '
        f'(SELECT g."name" FROM "{groups}" g JOIN "{memberships}" ug '
        f'ON ug."group_id" = g."id" WHERE ug."user_id" = u."{pk}" AND g."name" IN ({names}) '
        f'ORDER BY g."name" LIMIT 1) AS "_machine_group" '
        f'FROM "{Token._meta.db_table}" t JOIN "{users}" u ON u."{pk}" = t."user_id" '
        f'WHERE t."key" = %s'
    )


class TokenAuthentication(authentication.TokenAuthentication):
    """`Authorization: Token <key>`, as DRF's, answered with a single query."""

    def authenticate_credentials(self, key):
        found = list(get_user_model().objects.raw(_sql(), [*SOURCE_GROUPS, key]))
        if not found:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        user = found[0]
        if not user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        user_label_source_remember(user=user, group=user._machine_group)
        return user, Token(key=key, user=user, created=user._token_created)
