"""Accounts and retention: API tokens, deactivation, archiving instead of deleting.

Judgments are the lab's paid-for data, so nothing here deletes one: their foreign keys
PROTECT, a departing user is deactivated, and a finished project or round is archived.
"""

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from rest_framework.authtoken.models import Token

from annotation.models import Project, Round


def token_expired(*, token: Token) -> bool:
    """Return whether a human account's token is older than API_TOKEN_LIFETIME."""
    return token.created < timezone.now() - settings.API_TOKEN_LIFETIME


@transaction.atomic
def token_issue(*, user, fresh: bool = False) -> Token:
    """Return the user's live API token, replacing an expired one (or any, when fresh)."""
    token = Token.objects.select_for_update().filter(user=user).first()
    if token is not None:
        if not fresh and not token_expired(token=token):
            return token
        token.delete()
    # get_or_create: a concurrent first login of the same user may have made one meanwhile.
    return Token.objects.get_or_create(user=user)[0]


def token_revoke(*, user) -> int:
    """Delete the user's API token; return how many were deleted."""
    deleted, _ = Token.objects.filter(user=user).delete()
    return deleted


@transaction.atomic
def user_deactivate(*, user) -> None:
    """Stop a user from logging in or calling the API; keep everything they labelled."""
    type(user).objects.filter(pk=user.pk).update(is_active=False)
    user.is_active = False
    token_revoke(user=user)


def project_archive(*, project: Project, archived: bool = True) -> Project:
    """Hide a project from its annotators and stop serving it, or bring it back."""
    Project.objects.filter(pk=project.pk).update(archived=archived)
    project.archived = archived
    return project


def round_archive(*, round_: Round) -> Round:
    """Close a round for good; its items and judgments stay."""
    now = timezone.now()
    Round.objects.filter(pk=round_.pk).update(
        archived=True, status=Round.Status.CLOSED, closed_at=round_.closed_at or now
    )
    round_.archived, round_.status = True, Round.Status.CLOSED
    round_.closed_at = round_.closed_at or now
    return round_
