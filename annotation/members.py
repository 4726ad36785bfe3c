"""Members of a project: roles, pauses, and which label source an account's judgments carry."""

from annotation.errors import ServiceError
from annotation.models import LabelSource, Membership, Project

# Accounts in these groups label as machines; their judgments never pass for human ones.
SOURCE_GROUPS = {"prefloop:simulated": LabelSource.SIMULATED, "prefloop:ai": LabelSource.AI}


def label_source_for(*, user) -> str:
    """Return the label source of a user's judgments: human unless a machine account."""
    known = getattr(user, "_prefloop_label_source", None)
    if known is not None:
        return known
    group = user.groups.filter(name__in=list(SOURCE_GROUPS)).values_list("name", flat=True)
    return user_label_source_remember(user=user, group=group.first())


def user_label_source_remember(*, user, group: str | None) -> str:
    """Note on this request's user object which label source its machine group gives."""
    user._prefloop_label_source = SOURCE_GROUPS[group] if group else LabelSource.HUMAN
    return user._prefloop_label_source


def simulated_annotator_ensure(
    *, project: Project, username: str, source: str = LabelSource.SIMULATED
) -> str:
    """Create (or reuse) a machine annotator in a project and return a fresh API token."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from annotation.accounts import token_issue

    group_name = next(g for g, s in SOURCE_GROUPS.items() if s == source)
    user, created = get_user_model().objects.get_or_create(username=username)
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    user.groups.add(Group.objects.get_or_create(name=group_name)[0])
    Membership.objects.get_or_create(project=project, user=user)
    # A new token per run: machine tokens do not expire, so none outlives its run.
    return token_issue(user=user, fresh=True).key


def membership_set(*, project: Project, user, role: str = Membership.Role.ANNOTATOR) -> Membership:
    """Add a user to a project with a role, or change their role."""
    if role not in Membership.Role.values:
        raise ServiceError(f"role must be one of {', '.join(Membership.Role.values)}.", code="role")
    membership, _ = Membership.objects.update_or_create(
        project=project, user=user, defaults={"role": role}
    )
    return membership


def membership_set_status(
    *, membership: Membership, status: str, reason: str = "", flagged: bool | None = None
) -> Membership:
    """Pause or resume an annotator; paused annotators are not served."""
    membership.status = status
    membership.status_reason = reason
    if flagged is not None:
        membership.flagged = flagged
    membership.save(update_fields=["status", "status_reason", "flagged"])
    return membership
