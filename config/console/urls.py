"""Routes of the researchers' console at /console/: projects, data, review, training."""

from django.urls import include, path

from config.console import data, projects, review

app_name = "console"

P = "projects/<int:project_id>/"

urlpatterns = [
    path("", projects.project_list, name="projects"),
    path("projects/new/", projects.project_new, name="project-new"),
    path(P, projects.project_detail, name="project"),
    path(P + "live/", projects.project_live, name="project-live"),
    path(P + "archive/", projects.project_archive, name="project-archive"),
    path(P + "members/", projects.member_add, name="member-add"),
    path(P + "members/<int:user_id>/pause/", projects.member_pause, name="member-pause"),
    path(P + "members/<int:user_id>/resume/", projects.member_resume, name="member-resume"),
    path(P + "data/", data.data_page, name="data"),
    path(P + "data/import/", data.import_upload, name="import"),
    path(P + "data/imports/<int:job_id>/", data.import_job, name="import-job"),
    path(P + "data/export/", data.export_create, name="export"),
    path(P + "datasets/<int:version>/", data.dataset_detail, name="dataset"),
    path(P + "datasets/<int:version>/files/<str:name>", data.dataset_file, name="dataset-file"),
    path(P + "review/", review.review_queue, name="review"),
    path(P + "review/refresh/", review.review_refresh, name="review-refresh"),
    path(P + "review/items/<int:item_id>/verdict/", review.verdict_create, name="verdict"),
    path(P + "training/", include("config.console.training_urls")),
    path(P + "models/", include("config.console.models_urls")),
    path(P + "pool/", include("config.console.pool_urls")),
    path(P + "loop/", include("config.console.loop_urls")),
]
