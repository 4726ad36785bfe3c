from django.urls import include, path

from annotation import apis, apis_data

urlpatterns = [
    path("projects/", apis.ProjectListApi.as_view(), name="api-projects"),
    path("projects/<int:project_id>/", apis.ProjectDetailApi.as_view(), name="api-project"),
    path("projects/<int:project_id>/members/", apis.MembershipApi.as_view(), name="api-members"),
    path("projects/<int:project_id>/rounds/", apis.RoundListApi.as_view(), name="api-rounds"),
    path(
        "projects/<int:project_id>/rounds/<int:number>/close/",
        apis.RoundCloseApi.as_view(),
        name="api-round-close",
    ),
    path("projects/<int:project_id>/import/", apis.ImportApi.as_view(), name="api-import"),
    path("projects/<int:project_id>/next/", apis.NextApi.as_view(), name="api-next"),
    path("projects/<int:project_id>/progress/", apis.ProgressApi.as_view(), name="api-progress"),
    path("assignments/<int:assignment_id>/submit/", apis.SubmitApi.as_view(), name="api-submit"),
    path("assignments/<int:assignment_id>/skip/", apis.SkipApi.as_view(), name="api-skip"),
    path("assignments/<int:assignment_id>/release/", apis.ReleaseApi.as_view(), name="api-release"),
    path("projects/<int:project_id>/prefetch/", apis.PrefetchApi.as_view(), name="api-prefetch"),
    path(
        "assignments/<int:assignment_id>/heartbeat/",
        apis.HeartbeatApi.as_view(),
        name="api-heartbeat",
    ),
    path(
        "projects/<int:project_id>/import-preferences/",
        apis_data.PreferenceImportApi.as_view(),
        name="api-import-preferences",
    ),
    path(
        "projects/<int:project_id>/imports/<int:job_id>/",
        apis_data.ImportJobDetailApi.as_view(),
        name="api-import-job",
    ),
    path(
        "projects/<int:project_id>/datasets/",
        apis_data.DatasetListApi.as_view(),
        name="api-datasets",
    ),
    path(
        "projects/<int:project_id>/datasets/<int:version>/",
        apis_data.DatasetDetailApi.as_view(),
        name="api-dataset",
    ),
    path(
        "projects/<int:project_id>/datasets/<int:version>/files/<str:name>",
        apis_data.DatasetFileApi.as_view(),
        name="api-dataset-file",
    ),
    path("", include("annotation.urls_pool")),
]
