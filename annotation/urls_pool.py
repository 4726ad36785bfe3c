"""API of a project's prompt pool."""

from django.urls import path

from annotation import apis_pool

urlpatterns: list = [
    path(
        "projects/<int:project_id>/prompts/",
        apis_pool.PromptPoolListApi.as_view(),
        name="api-prompt-pool",
    ),
    path(
        "projects/<int:project_id>/prompts/import/",
        apis_pool.PromptPoolImportApi.as_view(),
        name="api-prompt-pool-import",
    ),
    path(
        "projects/<int:project_id>/prompts/counts/",
        apis_pool.PromptPoolCountsApi.as_view(),
        name="api-prompt-pool-counts",
    ),
]
