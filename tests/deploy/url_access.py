"""Who may use which URL: the table tests/deploy/test_permissions.py checks every URL against.

Every URL pattern in the URLconf needs an entry here, keyed by its name (`namespace:name`
for namespaced ones; `namespace:*` covers a whole namespace). A new endpoint without an
entry fails `test_every_url_is_classified`: add it with the roles that may use each method.

Roles of the matrix, all about one project P (see the `world` fixture):
  anonymous         not logged in
  outsider          annotator of another project
  other_researcher  researcher of another project
  annotator         annotator of P (has a live assignment of their own)
  reviewer          reviewer of P
  researcher        researcher of P
  staff             staff superuser, member of no project

Public (anonymous may get a 2xx): the login pages and the token endpoint (they are how one
logs in), the logout pages, and the OpenAPI schema with its Swagger UI (structure only, no
data): login, logout, api-token, api-schema, api-docs, admin:login, admin:logout.
Static files are served by whitenoise before the URLconf and carry no data.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass, field

ROLES = (
    "anonymous",
    "outsider",
    "other_researcher",
    "annotator",
    "reviewer",
    "researcher",
    "staff",
)

# Field names that give gold items or assignment kinds away: never in an annotator's answer.
GIVEAWAYS = re.compile(r'is_gold|gold_answer|"kind"\s*:\s*"(gold|repeat|primary)"')

# Who gets in, as sets of roles.
PUBLIC = frozenset(ROLES)
LOGGED_IN = PUBLIC - {"anonymous"}
# Any researcher (lists filtered to their own projects) and staff.
ANY_RESEARCHER = frozenset({"other_researcher", "researcher", "staff"})
# Members of P in any role, and staff (who see every project).
MEMBER = frozenset({"annotator", "reviewer", "researcher", "staff"})
# Work served to a member of P: staff are no member, so they are not served.
MEMBER_ONLY = frozenset({"annotator", "reviewer", "researcher"})
REVIEWER = frozenset({"reviewer", "researcher", "staff"})
RESEARCHER = frozenset({"researcher", "staff"})
STAFF = frozenset({"staff"})


@dataclass(frozen=True)
class Rule:
    """The roles that may use each method of a URL (None: the method is not served).

    GET and POST are tried on every URL; PUT, PATCH and DELETE on views that define them.
    """

    get: frozenset | None = None
    post: frozenset | None = None
    put: frozenset | None = None
    patch: frozenset | None = None
    delete: frozenset | None = None
    # Body of POST/PUT/PATCH, from the world (default: empty JSON for /api/, else empty form).
    data: Callable | None = None
    # Query string for GET.
    query: str = ""
    # Statuses an allowed role may also get (e.g. a 404 the view answers for every object).
    also_ok: frozenset = field(default_factory=frozenset)


ACCESS: dict[str, Rule] = {
    # --- logging in and out, API docs (public) ---
    "login": Rule(get=PUBLIC, post=PUBLIC, put=PUBLIC),  # Django's form views take PUT too
    "logout": Rule(post=PUBLIC),
    "api-token": Rule(post=PUBLIC),
    # Revokes the caller's own token (204 even when they have none).
    "api-token-revoke": Rule(post=LOGGED_IN),
    "api-schema": Rule(get=PUBLIC),
    "api-docs": Rule(get=PUBLIC),
    # --- annotator pages ---
    "annotate-home": Rule(get=LOGGED_IN),
    "annotate-task": Rule(get=MEMBER_ONLY),
    "annotate-next": Rule(post=MEMBER_ONLY),
    "annotate-skip": Rule(post=MEMBER_ONLY, data=lambda w: {"reason": "unreadable"}),
    # --- annotation API ---
    "api-projects": Rule(get=LOGGED_IN, post=STAFF),
    "api-project": Rule(get=MEMBER),
    "api-members": Rule(post=RESEARCHER),
    "api-rounds": Rule(get=RESEARCHER, post=RESEARCHER),
    "api-round-close": Rule(post=RESEARCHER),
    "api-import": Rule(post=RESEARCHER),
    "api-import-preferences": Rule(post=RESEARCHER),
    "api-import-job": Rule(get=RESEARCHER),
    # The prompt pool: its researchers only (an empty JSON body is a 415 for them).
    "api-prompt-pool": Rule(get=RESEARCHER),
    "api-prompt-pool-import": Rule(post=RESEARCHER),
    "api-prompt-pool-counts": Rule(get=RESEARCHER),
    "api-next": Rule(post=MEMBER_ONLY),
    "api-progress": Rule(get=MEMBER),
    "api-submit": Rule(post=MEMBER_ONLY),
    "api-skip": Rule(post=MEMBER_ONLY, data=lambda w: {"reason": "unreadable"}),
    "api-heartbeat": Rule(post=MEMBER_ONLY),
    "api-prefetch": Rule(post=MEMBER_ONLY, data=lambda w: {"html": True}),
    "api-release": Rule(post=MEMBER_ONLY),
    # --- datasets (exports) ---
    "api-datasets": Rule(get=RESEARCHER, post=RESEARCHER),
    "api-dataset": Rule(get=RESEARCHER),
    "api-dataset-file": Rule(get=RESEARCHER),
    # --- training runs and the model registry ---
    "api-training-runs": Rule(
        get=ANY_RESEARCHER,
        post=RESEARCHER,
        data=lambda w: {
            "recipe": "reward",
            "config": {},
            "dataset_version_id": w.dataset.pk,
        },
    ),
    "api-training-run": Rule(get=RESEARCHER),
    "api-training-run-cancel": Rule(post=RESEARCHER),
    "api-training-run-resume": Rule(post=RESEARCHER),
    "api-model-versions": Rule(get=ANY_RESEARCHER),
    # Rounds generated from the project's policies (an empty body is a 400 naming the fields).
    "api-generation-jobs": Rule(get=RESEARCHER, post=RESEARCHER),
    "api-generation-job": Rule(get=RESEARCHER),
    "api-model-version": Rule(get=RESEARCHER),
    # The registry: folders are staff's; uploads, naming a run's version and validating again
    # are the project's researchers' (an empty upload is a 400 naming the field).
    "api-model-register-folder": Rule(post=STAFF),
    "api-model-upload": Rule(post=RESEARCHER),
    "api-model-version-register": Rule(post=RESEARCHER, data=lambda w: {"name": "renamed-v1"}),
    "api-model-version-validate": Rule(post=RESEARCHER),
    # Names and models of the deployment's generation endpoints (no URLs, no keys).
    "api-generation-endpoints": Rule(get=ANY_RESEARCHER),
    # An unknown endpoint is a 400 for P's researchers; other projects' researchers get 404.
    "api-model-version-endpoint": Rule(
        post=RESEARCHER,
        data=lambda w: {"project_id": w.project.pk, "name": "e", "endpoint": "x", "model": "m"},
    ),
    # --- a project's loop: settings, timeline and actions, for its researchers ---
    # A project without a loop: PUT without 'path' is a 400 naming it; actions are a 409.
    "api-loop": Rule(get=RESEARCHER, put=RESEARCHER, also_ok=frozenset({400})),
    "api-loop-timeline": Rule(get=RESEARCHER),
    "api-loop-step": Rule(post=RESEARCHER, also_ok=frozenset({409})),
    "api-loop-pause": Rule(post=RESEARCHER, also_ok=frozenset({409})),
    "api-loop-resume": Rule(post=RESEARCHER, also_ok=frozenset({409})),
    # Without a reason the decision is a 400 naming it (P's researchers and staff only).
    "api-model-version-promote": Rule(post=RESEARCHER),
    "api-model-version-reject": Rule(post=RESEARCHER),
    # --- QC: figures and other people's labels for reviewers, controls for researchers ---
    "api-qc-agreement": Rule(get=REVIEWER),
    "api-qc-labels": Rule(get=REVIEWER),
    "api-qc-disagreements": Rule(get=REVIEWER),
    "api-qc-item": Rule(get=REVIEWER),
    "api-qc-adjudicate": Rule(post=REVIEWER, data=lambda w: {"choice": "A", "note": "A wins"}),
    "api-qc-annotators": Rule(get=RESEARCHER),
    "api-qc-assessments": Rule(get=RESEARCHER),
    "api-qc-resume": Rule(post=RESEARCHER),
    "api-qc-policy": Rule(get=RESEARCHER, patch=RESEARCHER),
    "api-qc-check": Rule(post=RESEARCHER),
    # --- researchers' dashboard (pages) ---
    "dashboard:home": Rule(get=ANY_RESEARCHER),
    "dashboard:project": Rule(get=RESEARCHER),
    "dashboard:models": Rule(get=RESEARCHER),
    "dashboard:reward-models": Rule(get=RESEARCHER),
    "dashboard:training": Rule(get=RESEARCHER),
    "dashboard:run": Rule(get=RESEARCHER),
    # --- researchers' console (pages; forms post as HTML forms) ---
    # Anyone who runs or reviews a project sees the list (filtered to their projects).
    "console:projects": Rule(get=ANY_RESEARCHER | {"reviewer"}),
    # Creating projects is staff only, as in the API.
    "console:project-new": Rule(get=STAFF, post=STAFF),
    "console:project": Rule(get=RESEARCHER),
    "console:project-live": Rule(get=RESEARCHER),
    "console:project-archive": Rule(post=RESEARCHER),
    "console:member-add": Rule(post=RESEARCHER),
    "console:member-pause": Rule(post=RESEARCHER),
    "console:member-resume": Rule(post=RESEARCHER),
    "console:data": Rule(get=RESEARCHER),
    "console:import": Rule(post=RESEARCHER),
    "console:import-job": Rule(get=RESEARCHER),
    "console:export": Rule(post=RESEARCHER),
    "console:dataset": Rule(get=RESEARCHER),
    "console:dataset-file": Rule(get=RESEARCHER),
    "console:review": Rule(get=REVIEWER),
    "console:review-refresh": Rule(post=REVIEWER),
    "console:verdict": Rule(post=REVIEWER),
    # The training pages: forms and live fragments for the project's researchers.
    "console:training": Rule(get=RESEARCHER),
    "console:training-runs": Rule(get=RESEARCHER),
    "console:training-new": Rule(get=RESEARCHER, post=RESEARCHER),
    "console:training-run": Rule(get=RESEARCHER),
    "console:training-run-live": Rule(get=RESEARCHER),
    "console:training-run-cancel": Rule(post=RESEARCHER),
    "console:training-run-resume": Rule(post=RESEARCHER),
    # The models pages: the table polls (286 once nothing is validating); folders are staff's.
    "console:models": Rule(get=RESEARCHER),
    "console:models-table": Rule(get=RESEARCHER),
    "console:models-upload": Rule(post=RESEARCHER),
    "console:models-folder": Rule(post=STAFF),
    "console:models-register": Rule(post=RESEARCHER),
    "console:models-validate": Rule(post=RESEARCHER),
    # The prompt pool page: upload, generate a round, a generation job's live fragment.
    "console:pool": Rule(get=RESEARCHER),
    "console:pool-import": Rule(post=RESEARCHER),
    "console:pool-generate": Rule(post=RESEARCHER),
    "console:pool-job": Rule(get=RESEARCHER),
    # The loop page: timeline (polled), actions and settings for the project's researchers.
    # An empty settings form is a 400 naming 'path'; actions answer with a redirect back.
    "console:loop": Rule(get=RESEARCHER),
    "console:loop-live": Rule(get=RESEARCHER),
    "console:loop-settings": Rule(post=RESEARCHER, also_ok=frozenset({400})),
    "console:loop-step": Rule(post=RESEARCHER),
    "console:loop-pause": Rule(post=RESEARCHER),
    "console:loop-resume": Rule(post=RESEARCHER),
    "console:loop-promote": Rule(post=RESEARCHER),
    "console:loop-reject": Rule(post=RESEARCHER),
    # The world's run is not trained on a loop export: a 404 for everyone allowed in.
    "console:loop-run-cancel": Rule(post=RESEARCHER, also_ok=frozenset({404})),
    # --- Django admin: staff only, except its login page ---
    # Staff may still get 403 where a model admin is read-only (no add/change permission).
    "admin:*": Rule(get=STAFF, post=STAFF, also_ok=frozenset({403})),
    "admin:login": Rule(get=PUBLIC, post=PUBLIC),
    # Logging out shows nothing; the admin sends non-staff callers to its index.
    "admin:logout": Rule(get=PUBLIC, post=PUBLIC),
    "admin:password_change_done": Rule(get=STAFF),
    "admin:jsi18n": Rule(get=STAFF),
    "admin:autocomplete": Rule(
        get=STAFF,
        query="app_label=annotation&model_name=membership&field_name=user&term=a",
    ),
    # The shortcut answers 404 for models without get_absolute_url (all of ours).
    "admin:view_on_site": Rule(get=STAFF, also_ok=frozenset({404})),
}


def rule_for(name: str) -> Rule | None:
    """Return the rule of a URL name: its own entry, else its namespace's `ns:*` entry."""
    if name in ACCESS:
        return ACCESS[name]
    namespace, _, _ = name.rpartition(":")
    while namespace:
        if f"{namespace}:*" in ACCESS:
            return ACCESS[f"{namespace}:*"]
        namespace, _, _ = namespace.rpartition(":")
    return None
