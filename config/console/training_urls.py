"""Routes of the console's training pages, under /console/projects/<project_id>/training/."""

from django.urls import path

from config.console import training

urlpatterns = [
    path("", training.training_home, name="training"),
    path("runs/", training.training_runs_live, name="training-runs"),
    path("new/<str:recipe>/", training.training_run_new, name="training-new"),
    path("runs/<int:run_id>/", training.training_run_detail, name="training-run"),
    path("runs/<int:run_id>/live/", training.training_run_live, name="training-run-live"),
    path("runs/<int:run_id>/cancel/", training.training_run_cancel, name="training-run-cancel"),
    path("runs/<int:run_id>/resume/", training.training_run_resume, name="training-run-resume"),
]
