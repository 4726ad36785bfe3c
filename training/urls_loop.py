"""API of a project's loop: state, timeline, actions."""

from django.urls import path

from training import apis_loop

L = "projects/<int:project_id>/loop/"

urlpatterns = [
    path(L, apis_loop.LoopApi.as_view(), name="api-loop"),
    path(L + "timeline/", apis_loop.LoopTimelineApi.as_view(), name="api-loop-timeline"),
    path(L + "step/", apis_loop.LoopStepApi.as_view(), name="api-loop-step"),
    path(L + "pause/", apis_loop.LoopPauseApi.as_view(), name="api-loop-pause"),
    path(L + "resume/", apis_loop.LoopResumeApi.as_view(), name="api-loop-resume"),
    path(
        "models/<int:version_id>/promote/",
        apis_loop.ModelVersionDecideApi.as_view(),
        name="api-model-version-promote",
    ),
    path(
        "models/<int:version_id>/reject/",
        apis_loop.ModelVersionRejectApi.as_view(),
        name="api-model-version-reject",
    ),
]
