"""API of round generation jobs: a round from one or more registered policies."""

from django.urls import path

from training import apis_rounds

urlpatterns: list = [
    path(
        "projects/<int:project_id>/generation-jobs/",
        apis_rounds.GenerationJobListApi.as_view(),
        name="api-generation-jobs",
    ),
    path(
        "projects/<int:project_id>/generation-jobs/<int:generation_job_id>/",
        apis_rounds.GenerationJobDetailApi.as_view(),
        name="api-generation-job",
    ),
]
