"""Console page of a project's loop, under /console/projects/<project_id>/loop/."""

from django.urls import path

from config.console import loop

urlpatterns = [
    path("", loop.loop_page, name="loop"),
    path("live/", loop.loop_live, name="loop-live"),
    path("settings/", loop.loop_settings_save, name="loop-settings"),
    path("step/", loop.loop_step, name="loop-step"),
    path("pause/", loop.loop_pause, name="loop-pause"),
    path("resume/", loop.loop_resume, name="loop-resume"),
    path("models/<int:version_id>/promote/", loop.loop_promote, name="loop-promote"),
    path("models/<int:version_id>/reject/", loop.loop_reject, name="loop-reject"),
    path("runs/<int:run_id>/cancel/", loop.loop_run_cancel, name="loop-run-cancel"),
]
