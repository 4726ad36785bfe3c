"""QC routes, mounted at /api/qc/."""

from django.urls import path

from evaluation import apis

urlpatterns = [
    path(
        "projects/<int:project_id>/agreement/",
        apis.AgreementApi.as_view(),
        name="api-qc-agreement",
    ),
    path(
        "projects/<int:project_id>/labels/",
        apis.LabelDistributionApi.as_view(),
        name="api-qc-labels",
    ),
    path(
        "projects/<int:project_id>/annotators/",
        apis.AnnotatorQualityApi.as_view(),
        name="api-qc-annotators",
    ),
    path(
        "projects/<int:project_id>/annotators/<int:user_id>/assessments/",
        apis.AnnotatorAssessmentListApi.as_view(),
        name="api-qc-assessments",
    ),
    path(
        "projects/<int:project_id>/annotators/<int:user_id>/resume/",
        apis.AnnotatorResumeApi.as_view(),
        name="api-qc-resume",
    ),
    path("projects/<int:project_id>/policy/", apis.PolicyApi.as_view(), name="api-qc-policy"),
    path("projects/<int:project_id>/check/", apis.CheckApi.as_view(), name="api-qc-check"),
    path(
        "projects/<int:project_id>/disagreements/",
        apis.DisagreementQueueApi.as_view(),
        name="api-qc-disagreements",
    ),
    path("items/<int:item_id>/", apis.ReviewItemApi.as_view(), name="api-qc-item"),
    path(
        "items/<int:item_id>/adjudications/",
        apis.AdjudicationCreateApi.as_view(),
        name="api-qc-adjudicate",
    ),
]
