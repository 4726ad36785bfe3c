"""Annotator web pages: access, rendering, blindness and safe rendering of untrusted text."""

from html.parser import HTMLParser

import pytest
from django.test import Client
from django.urls import reverse

from annotation.models import Assignment, Candidate, Membership, Project, Skip, TaskKind
from annotation.views import render_untrusted
from tests.factories import add_member, make_items, make_project, make_user

pytestmark = pytest.mark.django_db

SECRET_MODELS = ("zebra-secret-model-7b", "quokka-hidden-model-70b")
FORBIDDEN = ("zebra-secret", "quokka-hidden", "ckpt-", "gold", "temperature", "is_repeat")


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__()
        self.seen: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.seen.append((tag, dict(attrs)))


def _login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def pairwise():
    project = make_project(
        rubric="Prefer **helpful** answers.", ask_strength=True, ask_confidence=True
    )
    annotator = make_user()
    add_member(project, annotator)
    make_items(project, 3, models=SECRET_MODELS, gold=["A"])
    return project, annotator


def test_pages_require_login(pairwise):
    project, _ = pairwise
    client = Client()
    for url in (reverse("annotate-home"), reverse("annotate-task", args=[project.pk])):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_login_page_renders_and_logs_in(pairwise):
    _, annotator = pairwise
    client = Client()
    page = client.get(reverse("login"))
    assert page.status_code == 200 and b'name="password"' in page.content
    response = client.post(reverse("login"), {"username": annotator.username, "password": "pw"})
    assert response.status_code == 302 and response["Location"] == reverse("annotate-home")


def test_home_lists_only_own_projects_with_progress(pairwise):
    project, annotator = pairwise
    other = make_project(name="not mine")
    response = _login(annotator).get(reverse("annotate-home"))
    html = response.content.decode()
    assert response.status_code == 200
    assert project.name in html and other.name not in html
    assert reverse("annotate-task", args=[project.pk]) in html
    assert "<progress" in html


def test_non_member_gets_404_everywhere(pairwise):
    project, _ = pairwise
    client = _login(make_user())
    assert client.get(reverse("annotate-task", args=[project.pk])).status_code == 404
    assert client.post(reverse("annotate-next", args=[project.pk])).status_code == 404
    assert not Assignment.objects.exists()


def test_task_page_serves_an_item_blind(pairwise):
    project, annotator = pairwise
    response = _login(annotator).get(reverse("annotate-task", args=[project.pk]))
    html = response.content.decode()
    assert response.status_code == 200
    assignment = Assignment.objects.get(annotator=annotator)
    assert f'data-assignment="{assignment.pk}"' in html
    for text in Candidate.objects.filter(items=assignment.item).values_list("text", flat=True):
        assert text in html
    assert "Response A" in html and "Response B" in html
    for secret in FORBIDDEN:
        assert secret not in html.lower(), secret
    # Only the answers the project enables; strength and confidence because it asks for them.
    assert 'value="tie"' in html and 'value="both_bad"' in html
    assert 'name="strength"' in html and 'name="confidence"' in html
    assert 'name="rationale"' not in html
    assert "<strong>helpful</strong>" in html


def test_task_page_hides_disabled_answers():
    project = make_project(allow_tie=False, allow_both_bad=False)
    annotator = make_user()
    add_member(project, annotator)
    make_items(project, 1)
    html = _login(annotator).get(reverse("annotate-task", args=[project.pk])).content.decode()
    assert 'value="A"' in html and 'value="B"' in html
    assert 'value="tie"' not in html and 'value="both_bad"' not in html


def test_page_has_no_inline_script_or_style(pairwise):
    project, annotator = pairwise
    response = _login(annotator).get(reverse("annotate-task", args=[project.pk]))
    html = response.content.decode()
    assert "<script>" not in html and "<style" not in html and " style=" not in html
    assert " onclick=" not in html and "javascript:" not in html
    assert "script-src 'self'" in response["Content-Security-Policy"]


def test_reload_shows_the_same_item(pairwise):
    project, annotator = pairwise
    client = _login(annotator)
    client.get(reverse("annotate-task", args=[project.pk]))
    client.get(reverse("annotate-task", args=[project.pk]))
    assert Assignment.objects.filter(annotator=annotator).count() == 1


def test_ranking_page_lists_cards_in_display_order():
    project = make_project(task_kind=TaskKind.RANKING, k=4, allow_tie=True)
    annotator = make_user()
    add_member(project, annotator)
    make_items(project, 1, models=("m-alpha", "m-beta", "m-gamma", "m-delta"))
    html = _login(annotator).get(reverse("annotate-task", args=[project.pk])).content.decode()
    assert 'id="ranking"' in html and html.count('class="rank-card"') == 4
    assert [html.index(f'data-slot="{s}" data-index') for s in "ABCD"] == sorted(
        html.index(f'data-slot="{s}" data-index') for s in "ABCD"
    )
    assert "tie-toggle" in html
    assert "m-alpha" not in html


def test_next_partial_and_done_state(pairwise):
    project, annotator = pairwise
    client = _login(annotator)
    url = reverse("annotate-next", args=[project.pk])
    assert client.post(url).status_code == 302  # without htmx: back to the page
    partial = client.post(url, headers={"HX-Request": "true"})
    assert partial.status_code == 200
    assert b'id="item"' in partial.content and b"<html" not in partial.content
    assert b'id="my-count" hx-swap-oob="true"' in partial.content
    Assignment.objects.update(status=Assignment.Status.SUBMITTED)
    Project.objects.filter(pk=project.pk).update(overlap=1, gold_rate=0)
    project.items.update(n_taken=1, n_done=1)
    done = client.post(url, headers={"HX-Request": "true"})
    assert b"All done for now" in done.content


def test_paused_annotator_sees_a_notice(pairwise):
    project, annotator = pairwise
    Membership.objects.filter(user=annotator).update(status=Membership.Status.PAUSED)
    html = _login(annotator).get(reverse("annotate-task", args=[project.pk])).content.decode()
    assert "paused" in html.lower() and 'id="item"' not in html


def test_skip_records_reason_and_serves_next(pairwise):
    project, annotator = pairwise
    client = _login(annotator)
    client.get(reverse("annotate-task", args=[project.pk]))
    first = Assignment.objects.get(annotator=annotator)
    response = client.post(
        reverse("annotate-skip", args=[project.pk, first.pk]),
        {"reason": "other", "reason_other": "Prompt is in a language I do not read"},
        headers={"HX-Request": "true"},
    )
    assert response.status_code == 200
    first.refresh_from_db()
    assert first.status == Assignment.Status.SKIPPED
    assert Skip.objects.get(assignment=first).reason == "Prompt is in a language I do not read"
    second = Assignment.objects.get(annotator=annotator, status=Assignment.Status.LEASED)
    assert f'data-assignment="{second.pk}"' in response.content.decode()


def test_skip_without_reason_keeps_the_item(pairwise):
    project, annotator = pairwise
    client = _login(annotator)
    client.get(reverse("annotate-task", args=[project.pk]))
    first = Assignment.objects.get(annotator=annotator)
    response = client.post(
        reverse("annotate-skip", args=[project.pk, first.pk]),
        {"reason": "other", "reason_other": ""},
        headers={"HX-Request": "true"},
    )
    first.refresh_from_db()
    assert first.status == Assignment.Status.LEASED
    assert b"needs a reason" in response.content


def test_someone_elses_assignment_cannot_be_skipped(pairwise):
    project, annotator = pairwise
    _login(annotator).get(reverse("annotate-task", args=[project.pk]))
    first = Assignment.objects.get(annotator=annotator)
    intruder = make_user()
    add_member(project, intruder)
    response = _login(intruder).post(
        reverse("annotate-skip", args=[project.pk, first.pk]), {"reason": "expertise"}
    )
    assert response.status_code == 404


@pytest.mark.parametrize(
    "source",
    [
        "<img src=x onerror=alert(1)>",
        "<script>alert(2)</script>",
        "[link](javascript:alert(3))",
        '<a href="javascript:alert(3)">x</a>',
        "![pixel](https://tracker.example/p.png)",
        '<iframe src="https://evil.example"></iframe>',
        "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    ],
)
def test_untrusted_text_never_becomes_markup(source):
    html = str(render_untrusted(source))
    tags = _Tags()
    tags.feed(html)
    assert {"img", "script", "iframe"}.isdisjoint(tag for tag, _ in tags.seen), html
    for _, attrs in tags.seen:
        assert not any(name.startswith("on") for name in attrs), html
        assert not attrs.get("href", "https:").startswith(("javascript:", "data:")), html
    # The text itself is still there for the annotator to read.
    assert html.startswith("<p>") and len(html) > 10


def test_untrusted_text_keeps_code_blocks_and_line_breaks():
    html = str(render_untrusted("first line\nsecond line\n\n```python\nprint('<b>')\n```"))
    assert "first line<br>" in html
    assert "<pre><code>print('&lt;b&gt;')" in html
    assert str(render_untrusted("![pixel](https://tracker.example/p.png)")) == (
        "<p>[image: pixel]</p>\n"
    )
    link = str(render_untrusted("[site](https://example.org)"))
    assert 'href="https://example.org"' in link and 'rel="noopener noreferrer nofollow"' in link


def test_chat_prompt_renders_turns_with_roles():
    project = make_project()
    annotator = make_user()
    add_member(project, annotator)
    (item,) = make_items(project, 1)
    item.prompt.messages = [
        {"role": "system", "content": "Be brief.", "name": "internal-bot"},
        {"role": "user", "content": "Hi <b>there</b>"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Tell me a joke."},
    ]
    item.prompt.save()
    html = _login(annotator).get(reverse("annotate-task", args=[project.pk])).content.decode()
    for label in ("System", "User", "Assistant"):
        assert f'<div class="turn-role">{label}</div>' in html
    assert "Hi &lt;b&gt;there&lt;/b&gt;" in html
    assert "internal-bot" not in html
