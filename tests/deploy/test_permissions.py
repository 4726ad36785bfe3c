"""Permission matrix: every URL in the URLconf x every role x GET and POST.

The URLs are enumerated from `get_resolver()`, so a new endpoint is covered as soon as it
is routed; `test_every_url_is_classified` fails until it has an entry in
tests/deploy/url_access.py (which documents the roles and the public URLs). For each role,
every URL is requested inside a savepoint that is rolled back, so requests cannot affect
each other. Checked:
- a role the table allows is let in (no 401/403/404/405, no redirect to a login page, no 5xx);
- a role it does not allow is turned away (401/403/404 or a redirect to a login page), so
  anonymous never gets a 2xx outside the public list;
- a method the table does not list is refused (or 405) for everyone;
- nothing an annotator, an outsider or an anonymous visitor sees carries model names,
  checkpoints, generation settings, gold flags, dataset or run details, or another
  annotator's labels (distinctive strings planted in the fixtures).
"""

import copy
import re
from dataclasses import dataclass, field
from urllib.parse import urlparse

import pytest
from django.db import transaction
from django.http import JsonResponse
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.urls import path as url_path

from annotation import services
from annotation.models import Assignment, Candidate, DatasetVersion, Membership, Round
from tests.deploy.url_access import (
    ACCESS,
    GIVEAWAYS,
    PUBLIC,
    RESEARCHER,
    ROLES,
    STAFF,
    Rule,
    rule_for,
)
from tests.factories import add_member, make_items, make_project, make_user
from training.models import ModelVersion, TrainingRun

# Distinctive strings: none may reach a blind role.
SECRET_MODEL = "zeta-secret-model-7b"
SECRET_CHECKPOINT = "ckpt-secret-4417"
SECRET_GENCFG = "gencfg-secret-template-93"
SECRET_POLICY = "policy-secret-v9"
SECRET_DATASET = "dataset-secret-3391"
SECRET_RUN = "run-secret-config-2718"
VICTIM = "victim-annotator-8830"
VICTIM_RATIONALE = "victim-rationale-5521"
SECRETS = (
    SECRET_MODEL,
    SECRET_CHECKPOINT,
    SECRET_GENCFG,
    SECRET_POLICY,
    SECRET_DATASET,
    SECRET_RUN,
    VICTIM,
    VICTIM_RATIONALE,
)
# Field names that give gold items or assignment kinds away.
STRUCTURAL = GIVEAWAYS
# Roles that must see nothing of the above (other_researcher: nothing of project P).
BLIND_ROLES = ("anonymous", "outsider", "other_researcher", "annotator")
STRUCTURE_BLIND_ROLES = ("anonymous", "outsider", "annotator")
# Pages that describe the API's shape, not data: field names are expected there.
SCHEMA_PAGES = {"api-schema", "api-docs"}


# --- the URLconf -------------------------------------------------------------------------
@dataclass
class Route:
    name: str  # namespaced name, or "<namespace>:<unnamed route>"
    kwargs: tuple[str, ...]
    named: bool = True
    view_class: type | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        """GET and POST always; PUT, PATCH, DELETE where the view class handles them."""
        handled = [m for m in ("PUT", "PATCH", "DELETE") if hasattr(self.view_class, m.lower())]
        return ("GET", "POST", *handled)


def _pattern_kwargs(pattern) -> list[str]:
    regex = getattr(pattern.pattern, "regex", None)
    return list(regex.groupindex) if regex is not None else []


def routes() -> list[Route]:
    """Return every URL pattern of the URLconf, depth first."""
    found = []

    def walk(patterns, namespaces, kwargs):
        for entry in patterns:
            here = kwargs + _pattern_kwargs(entry)
            if isinstance(entry, URLResolver):
                ns = [*namespaces, entry.namespace] if entry.namespace else namespaces
                walk(entry.url_patterns, ns, here)
            elif isinstance(entry, URLPattern):
                view_class = getattr(entry.callback, "view_class", None)
                if entry.name:
                    name = ":".join([*namespaces, entry.name])
                    found.append(Route(name, tuple(here), view_class=view_class))
                else:
                    label = ":".join([*namespaces, f"<{entry.pattern}>"])
                    found.append(Route(label, tuple(here), named=False))

    walk(get_resolver().url_patterns, [], [])
    return found


ROUTES = routes()
ROUTE_NAMES = sorted({r.name for r in ROUTES if r.named})


# --- the world ---------------------------------------------------------------------------
@dataclass
class World:
    users: dict = field(default_factory=dict)
    assignments: dict = field(default_factory=dict)
    project: object = None
    other: object = None
    round: object = None
    dataset: object = None
    run: object = None
    model_version: object = None
    victim_assignment: object = None
    victim: object = None
    victim_item: object = None


@pytest.fixture
def world(db, tmp_path) -> World:
    """Project P with a member of each role, planted secrets, a dataset, a run and a model."""
    w = World()
    w.project = make_project(
        name="matrix project", ask_rationale=True, rubric="Pick the more helpful answer."
    )
    w.other = make_project(name="elsewhere")
    w.users = {
        "anonymous": None,
        "outsider": make_user("outsider"),
        "other_researcher": make_user("other-researcher"),
        "annotator": make_user("annotator"),
        "reviewer": make_user("reviewer"),
        "researcher": make_user("researcher"),
        "staff": make_user("staff-admin", staff=True),
    }
    victim = make_user(VICTIM)
    add_member(w.other, w.users["outsider"])
    add_member(w.other, w.users["other_researcher"], role=Membership.Role.RESEARCHER)
    add_member(w.project, w.users["annotator"])
    add_member(w.project, w.users["reviewer"], role=Membership.Role.REVIEWER)
    add_member(w.project, w.users["researcher"], role=Membership.Role.RESEARCHER)
    add_member(w.project, victim)

    # Secrets on the model side: model names, checkpoints, generation settings.
    w.round = Round.objects.create(project=w.project, number=1)
    make_items(w.project, 4, round_=w.round, models=(SECRET_MODEL, "baseline"))
    gold = make_items(w.project, 1, round_=w.round, gold=["B"], models=(SECRET_MODEL, "b2"))[0]
    Candidate.objects.filter(prompt__project=w.project, model_name=SECRET_MODEL).update(
        checkpoint_id=SECRET_CHECKPOINT, generation_config={"template": SECRET_GENCFG}
    )
    make_items(w.other, 2)

    # Another annotator's label, then their next live lease.
    first = services.assignment_next(project_id=w.project.pk, user=victim)
    services.judgment_submit(
        assignment_id=first.pk, user=victim, choice="A", rationale=VICTIM_RATIONALE
    )
    w.victim_assignment = services.assignment_next(project_id=w.project.pk, user=victim)
    w.victim, w.victim_item = victim, first.item

    # The annotator's live item is the gold one: every annotator page shows a gold item.
    w.project.gold_rate = 1.0
    w.project.save(update_fields=["gold_rate"])
    w.assignments["annotator"] = services.assignment_next(
        project_id=w.project.pk, user=w.users["annotator"]
    )
    assert w.assignments["annotator"].item_id == gold.pk
    w.project.gold_rate = 0.0
    w.project.save(update_fields=["gold_rate"])
    for role in ("reviewer", "researcher"):
        w.assignments[role] = services.assignment_next(project_id=w.project.pk, user=w.users[role])

    # Research side: a ready dataset snapshot, a training run and the model it made.
    folder = tmp_path / "dataset-v1"
    folder.mkdir()
    (folder / "manifest.json").write_text(f'{{"name": "{SECRET_DATASET}"}}')
    (folder / "train.jsonl").write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n')
    w.dataset = DatasetVersion.objects.create(
        project=w.project,
        version=1,
        name=SECRET_DATASET,
        status=DatasetVersion.Status.READY,
        content_hash="0" * 64,
        path=str(folder),
    )
    w.run = TrainingRun.objects.create(
        recipe="reward",
        project=w.project,
        dataset_version=w.dataset,
        config={"note": SECRET_RUN},
        status=TrainingRun.Status.QUEUED,
    )
    w.model_version = ModelVersion.objects.create(
        name=SECRET_POLICY,
        artifact_path=str(tmp_path / "model"),
        training_run=w.run,
        dataset_version=w.dataset,
    )
    Round.objects.filter(pk=w.round.pk).update(model_version=w.model_version)
    return w


# --- URL arguments -----------------------------------------------------------------------
def _admin_object_id(w: World, route: Route, role: str) -> str:
    from django.apps import apps

    # admin:<app>_<model>_<view>: an existing row of that model, or "0" (none).
    match = re.match(r"admin:(\w+?)_(\w+)_(change|delete|history)$", route.name)
    if match:
        for model in apps.get_models():
            meta = model._meta
            if route.name.startswith(f"admin:{meta.app_label}_{meta.model_name}_"):
                row = model._default_manager.order_by("pk").first()
                return str(row.pk) if row else "0"
    return str(w.project.pk)


def _import_job_id(w: World, route: Route, role: str) -> int:
    from annotation.models import ImportJob

    job = ImportJob.objects.filter(project=w.project).first()
    return (job or ImportJob.objects.create(project=w.project, kind="items")).pk


def _generation_job_id(w: World, route: Route, role: str) -> int:
    from training.models import GenerationJob

    job = GenerationJob.objects.filter(project=w.project).first()
    return (job or GenerationJob.objects.create(project=w.project, source_key="matrix-job")).pk


def _assignment_id(w: World, route: Route, role: str) -> int:
    # One's own live assignment; a role without one tries the victim's (must be refused).
    own = w.assignments.get(role)
    return (own or w.victim_assignment).pk


# Builders of URL keyword arguments, by argument name. A new argument name needs one here.
KWARGS = {
    "project_id": lambda w, route, role: w.project.pk,
    "assignment_id": _assignment_id,
    "number": lambda w, route, role: w.round.number,
    "version": lambda w, route, role: w.dataset.version,
    "name": lambda w, route, role: "manifest.json",
    "run_id": lambda w, route, role: w.run.pk,
    "job_id": _import_job_id,
    "generation_job_id": _generation_job_id,
    "version_id": lambda w, route, role: w.model_version.pk,
    # An item of P another annotator labelled, and that annotator (QC and review pages).
    "item_id": lambda w, route, role: w.victim_item.pk,
    "user_id": lambda w, route, role: w.victim.pk,
    # The console's training form of one recipe.
    "recipe": lambda w, route, role: "dpo",
    # Django admin
    "object_id": _admin_object_id,
    "app_label": lambda w, route, role: "annotation",
    "content_type_id": lambda w, route, role: _content_type_id(),
    "id": lambda w, route, role: w.users["annotator"].pk,
}


def _content_type_id() -> int:
    from django.contrib.contenttypes.models import ContentType

    from annotation.models import Project

    return ContentType.objects.get_for_model(Project).pk


def _path(w: World, route: Route, role: str) -> str:
    kwargs = {}
    for name in route.kwargs:
        if name not in KWARGS:
            pytest.fail(f"{route.name}: add a builder for URL argument {name!r} to KWARGS")
        kwargs[name] = KWARGS[name](w, route, role)
    return reverse(route.name, kwargs=kwargs)


# --- requests ----------------------------------------------------------------------------
def _login_paths() -> set[str]:
    return {reverse("login"), reverse("admin:login")}


def _verdict(response) -> str:
    """Classify a response: ok, denied, not_allowed (405) or error (5xx)."""
    if response.status_code >= 500:
        return "error"
    if response.status_code in (401, 403, 404):
        return "denied"
    redirect = response.status_code in (301, 302, 303, 307, 308)
    if redirect and urlparse(response.get("Location", "")).path in _login_paths():
        return "denied"
    if response.status_code == 405:
        return "not_allowed"
    return "ok"


def _body(response) -> str:
    if getattr(response, "streaming", False):
        # Reading to the end closes the response (the test client's wrapper does it).
        content = b"".join(response.streaming_content)
    else:
        content = response.content
    return content.decode("utf-8", errors="replace")


def _request(client: Client, method: str, path: str, rule, w: World):
    # A logout among the requests must not log the next ones out: keep the cookies.
    cookies = copy.deepcopy(client.cookies)
    try:
        if method == "GET":
            return client.get(f"{path}?{rule.query}" if rule.query else path)
        if method == "DELETE":
            return client.delete(path)
        send = getattr(client, method.lower())
        data = rule.data(w) if rule.data else {}
        if path.startswith("/api/") or method != "POST":
            return send(path, data=data, content_type="application/json")
        return send(path, data=data)
    finally:
        client.cookies = cookies


def _check(route: Route, role: str, method: str, w: World, client: Client, rule=None) -> list[str]:
    """Request one URL as one role; return what is wrong with the answer."""
    rule = rule or rule_for(route.name)
    allowed = getattr(rule, method.lower())
    path = _path(w, route, role)
    problems = []
    try:
        with transaction.atomic():
            response = _request(client, method, path, rule, w)
            body = _body(response)
            transaction.set_rollback(True)
    except Exception as exc:  # the test client re-raises what the view raised
        return [f"{method} {path} as {role}: raised {type(exc).__name__}: {exc}"]
    status, verdict = response.status_code, _verdict(response)
    where = f"{method} {path} ({route.name}) as {role}: {status}"
    if verdict == "error":
        problems.append(f"{where} server error")
    elif allowed is None:
        if verdict not in ("denied", "not_allowed"):
            problems.append(f"{where}, but {method} is not in the table for this URL")
    elif role in allowed:
        if allowed is not PUBLIC and verdict != "ok" and status not in rule.also_ok:
            problems.append(f"{where}, but the table lets {role} in")
    elif verdict != "denied":
        problems.append(f"{where}, but the table keeps {role} out")

    if role in BLIND_ROLES:
        leaked = [s for s in SECRETS if s in body]
        if leaked:
            problems.append(f"{where} shows {leaked}")
    if role in STRUCTURE_BLIND_ROLES and route.name not in SCHEMA_PAGES:
        match = STRUCTURAL.search(body)
        if match:
            problems.append(f"{where} shows {match.group(0)!r}")
    return problems


def _client(w: World, role: str) -> Client:
    client = Client()
    if w.users[role] is not None:
        client.force_login(w.users[role])
    return client


# --- tests -------------------------------------------------------------------------------
pytestmark = pytest.mark.filterwarnings("ignore:No directory at")  # whitenoise, no collectstatic


def test_every_url_is_classified():
    unclassified = [name for name in ROUTE_NAMES if rule_for(name) is None]
    assert not unclassified, (
        "Classify these URLs in tests/deploy/url_access.py (ACCESS: name -> roles per "
        f"method): {unclassified}"
    )
    unnamed = [r.name for r in ROUTES if not r.named and rule_for(r.name) is None]
    assert not unnamed, f"Name these URL patterns so they can be classified: {unnamed}"
    stale = [name for name in ACCESS if not name.endswith(":*") and name not in set(ROUTE_NAMES)]
    assert not stale, f"ACCESS lists URLs that no longer exist: {stale}"


def test_public_list_is_short():
    # Anonymous visitors get in only here; anything added to it needs a good reason.
    public = {name for name, rule in ACCESS.items() if PUBLIC in (rule.get, rule.post)}
    assert public == {
        "login",
        "logout",
        "api-token",
        "api-schema",
        "api-docs",
        "admin:login",
        "admin:logout",
    }


@pytest.fixture
def no_broker(monkeypatch):
    """Keep tasks a view queues off the broker (their effects are rolled back anyway)."""
    from celery.app.task import Task

    monkeypatch.setattr(Task, "apply_async", lambda self, *args, **kwargs: None)


@pytest.mark.parametrize("role", ROLES)
def test_permission_matrix(world, role, no_broker):
    client = _client(world, role)
    problems = []
    for route in ROUTES:
        if not route.named or rule_for(route.name) is None:
            continue
        for method in route.methods:
            problems += _check(route, role, method, world, client)
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)


def test_an_annotator_cannot_use_another_annotators_assignment(world):
    # Same project, someone else's live assignment: every assignment endpoint refuses.
    client = _client(world, "annotator")
    routes_with_assignment = [r for r in ROUTES if "assignment_id" in r.kwargs and r.named]
    assert routes_with_assignment
    for route in routes_with_assignment:
        rule = rule_for(route.name)
        kwargs = {
            name: world.victim_assignment.pk
            if name == "assignment_id"
            else KWARGS[name](world, route, "annotator")
            for name in route.kwargs
        }
        path = reverse(route.name, kwargs=kwargs)
        for method in route.methods:
            with transaction.atomic():
                response = _request(client, method, path, rule, world)
                transaction.set_rollback(True)
            assert _verdict(response) in ("denied", "not_allowed"), (method, path)
    world.victim_assignment.refresh_from_db()
    assert world.victim_assignment.status == Assignment.Status.LEASED


# --- the checker catches what it is meant to catch ---------------------------------------
def _leaky(request):
    return JsonResponse({"model": SECRET_MODEL, "is_gold": True})


urlpatterns = [url_path("leaky/", _leaky, name="leaky")]


@override_settings(ROOT_URLCONF=__name__)
def test_the_checker_flags_leaks_and_open_doors(world):
    route = Route("leaky", ())
    # A researcher-only rule on a view that answers everyone, with secrets in it.
    rule = Rule(get=RESEARCHER)
    anonymous = _check(route, "anonymous", "GET", world, _client(world, "anonymous"), rule)
    assert any("keeps anonymous out" in p for p in anonymous)
    assert any(SECRET_MODEL in p for p in anonymous)
    assert any("is_gold" in p for p in anonymous)
    assert _check(route, "staff", "GET", world, _client(world, "staff"), rule) == []
    # A method the table does not list, answered 200, is flagged too.
    unlisted = _check(route, "staff", "GET", world, _client(world, "staff"), Rule(post=STAFF))
    assert any("not in the table" in p for p in unlisted)


def test_rule_lookup_falls_back_to_the_namespace():
    assert rule_for("api-brand-new-endpoint") is None
    assert rule_for("admin:some_new_model_changelist") is ACCESS["admin:*"]
    assert rule_for("admin:login") is ACCESS["admin:login"]
