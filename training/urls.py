from django.urls import include, path

from training import apis

urlpatterns = [
    path("runs/", apis.TrainingRunListApi.as_view(), name="api-training-runs"),
    path("runs/<int:run_id>/", apis.TrainingRunDetailApi.as_view(), name="api-training-run"),
    path(
        "runs/<int:run_id>/cancel/",
        apis.TrainingRunCancelApi.as_view(),
        name="api-training-run-cancel",
    ),
    path(
        "runs/<int:run_id>/resume/",
        apis.TrainingRunResumeApi.as_view(),
        name="api-training-run-resume",
    ),
    path("models/", apis.ModelVersionListApi.as_view(), name="api-model-versions"),
    path(
        "models/endpoint/",
        apis.ModelVersionEndpointCreateApi.as_view(),
        name="api-model-version-endpoint",
    ),
    path(
        "generation-endpoints/",
        apis.GenerationEndpointListApi.as_view(),
        name="api-generation-endpoints",
    ),
    path(
        "models/<int:version_id>/",
        apis.ModelVersionDetailApi.as_view(),
        name="api-model-version",
    ),
    path("", include("training.urls_registry")),
    path("", include("training.urls_rounds")),
    path("", include("training.urls_loop")),
]
