"""API of the model registry: register policies and reward models, validate, promote."""

from django.urls import path

from training import apis_registry

urlpatterns = [
    path(
        "models/folder/",
        apis_registry.ModelFolderRegisterApi.as_view(),
        name="api-model-register-folder",
    ),
    path(
        "projects/<int:project_id>/models/upload/",
        apis_registry.ModelUploadApi.as_view(),
        name="api-model-upload",
    ),
    path(
        "models/<int:version_id>/register/",
        apis_registry.ModelVersionRegisterApi.as_view(),
        name="api-model-version-register",
    ),
    path(
        "models/<int:version_id>/validate/",
        apis_registry.ModelVersionValidateApi.as_view(),
        name="api-model-version-validate",
    ),
]
