"""Routes of the researchers' evaluation dashboard (mounted at /dashboard/)."""

from django.urls import path

from evaluation import dashboard

app_name = "dashboard"

urlpatterns = [
    path("", dashboard.home, name="home"),
    path("projects/<int:project_id>/", dashboard.project_labels, name="project"),
    path("projects/<int:project_id>/models/", dashboard.project_models, name="models"),
    path(
        "projects/<int:project_id>/reward-models/",
        dashboard.project_reward_models,
        name="reward-models",
    ),
    path("projects/<int:project_id>/training/", dashboard.project_training, name="training"),
    path("runs/<int:run_id>/", dashboard.run_detail, name="run"),
]
