"""URL routes: admin, REST API with its OpenAPI schema, annotator pages, dashboard."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from annotation.apis_accounts import TokenObtainApi, TokenRevokeApi

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/auth/token/", TokenObtainApi.as_view(), name="api-token"),
    path("api/auth/token/revoke/", TokenRevokeApi.as_view(), name="api-token-revoke"),
    path("api/training/", include("training.urls")),
    path("api/qc/", include("evaluation.urls")),
    path("api/", include("annotation.urls")),
    path("dashboard/", include("config.console.dashboard.urls")),
    path("console/", include("config.console.urls")),
    path("", include("annotation.web_urls")),
]
