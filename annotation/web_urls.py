"""Annotator web pages (server-rendered; htmx partials for the next item and skips)."""

from django.urls import path

from annotation import views

urlpatterns = [
    path("", views.home, name="annotate-home"),
    path("projects/<int:project_id>/annotate/", views.task, name="annotate-task"),
    path("projects/<int:project_id>/annotate/next/", views.task_next, name="annotate-next"),
    path(
        "projects/<int:project_id>/annotate/<int:assignment_id>/skip/",
        views.task_skip,
        name="annotate-skip",
    ),
]
