"""Routes of the researchers' dashboard at /dashboard/ (researchers bookmark these paths)."""

from django.urls import path

from config.console.dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.home, name="home"),
    path("projects/<int:project_id>/", views.project_labels, name="project"),
    path("projects/<int:project_id>/models/", views.project_models, name="models"),
    path(
        "projects/<int:project_id>/reward-models/",
        views.project_reward_models,
        name="reward-models",
    ),
    path("projects/<int:project_id>/training/", views.project_training, name="training"),
    path("runs/<int:run_id>/", views.run_detail, name="run"),
]
