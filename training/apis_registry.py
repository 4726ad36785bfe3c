"""REST API of the model registry: register a folder (staff), upload an archive or name a run's
version (a project's researchers), and validate again.

Each view checks who may act on the ids it is given (in the URL first, then the body), then
calls one service of ``training.registry``. A registration answers 202 with the version,
status ``pending``: its validation runs as a Celery job, and GET /api/training/models/{id}/
shows the verdict (``status``, ``validation``, ``validation_error``).
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.permissions import IsAdminUser, IsAuthenticated
from rest_framework.response import Response

from annotation import access
from annotation.apis_imports import UploadField
from annotation.models import Project
from training import registry, registry_uploads
from training.apis import ModelVersionOutput, ResearcherApi

PROMPT_FORMAT_CHOICES = list(registry.PROMPT_FORMATS.items())
REFUSALS = {
    400: OpenApiResponse(description="A field is wrong (named in `field`); nothing was saved."),
    403: OpenApiResponse(description="The caller may not do this."),
    404: OpenApiResponse(description="No such project or model version (or not the caller's)."),
}


class _NameKind(serializers.Serializer):
    name = serializers.CharField(
        max_length=200, help_text="Unique name: letters, digits, '.', '_' or '-'."
    )
    # A plain string (checked by the service): the schema's kind enum is ModelVersion's.
    kind = serializers.CharField(max_length=16, help_text="policy or reward")
    prompt_format = serializers.ChoiceField(
        choices=PROMPT_FORMAT_CHOICES,
        required=False,
        default=registry.DEFAULT_PROMPT_FORMAT,
        help_text="chat_template (the tokenizer must have one) or plain (Human:/Assistant:).",
    )


class ModelFolderRegisterApi(ResearcherApi):
    """Register a transformers folder under the deployment's model roots, in place (staff)."""

    permission_classes = [IsAuthenticated, IsAdminUser]

    @extend_schema_serializer(component_name="ModelFolderInput")
    class InputSerializer(_NameKind):
        path = serializers.CharField(
            max_length=1000,
            help_text="Absolute folder under ARTIFACT_ROOT or PREFLOOP_MODEL_ROOTS.",
        )
        project_id = serializers.IntegerField(
            required=False, help_text="The project it is for (optional)."
        )

    @extend_schema(request=InputSerializer, responses={202: ModelVersionOutput, **REFUSALS})
    def post(self, request):
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        project = None
        if "project_id" in data:
            project = Project.objects.filter(pk=data["project_id"]).first()
            if project is None:
                raise NotFound("project_id: no such project.")
        version = registry.model_version_register_folder(
            name=data["name"],
            kind=data["kind"],
            path=data["path"],
            project=project,
            prompt_format=data["prompt_format"],
        )
        return Response(ModelVersionOutput(version).data, status=status.HTTP_202_ACCEPTED)


class ModelUploadApi(ResearcherApi):
    """Upload a model archive into the project's own folder; it is validated in the background."""

    parser_classes = [MultiPartParser, FormParser, JSONParser]

    @extend_schema_serializer(component_name="ModelUploadInput")
    class InputSerializer(_NameKind):
        file = UploadField(help_text="A .tar.gz, .tgz, .tar or .zip of a transformers folder.")

    @extend_schema(
        request={"multipart/form-data": InputSerializer},
        responses={
            202: ModelVersionOutput,
            413: OpenApiResponse(description="The archive is past a size limit (named)."),
            **REFUSALS,
        },
    )
    def post(self, request, project_id: int):
        # The project in the URL first: nothing about the body is said to outsiders.
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        registry_uploads.upload_declared_size_check(
            content_length=request.META.get("CONTENT_LENGTH")
        )
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        version = registry_uploads.model_version_upload(
            project=project,
            name=data["name"],
            kind=data["kind"],
            upload=data["file"],
            prompt_format=data["prompt_format"],
        )
        return Response(ModelVersionOutput(version).data, status=status.HTTP_202_ACCEPTED)


class ModelVersionRegisterApi(ResearcherApi):
    """Name a version one of the project's runs produced, and validate it."""

    @extend_schema_serializer(component_name="ModelVersionRegisterInput")
    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=200, help_text="The version's new unique name.")
        prompt_format = serializers.ChoiceField(
            choices=PROMPT_FORMAT_CHOICES, required=False, default=registry.DEFAULT_PROMPT_FORMAT
        )

    @extend_schema(request=InputSerializer, responses={202: ModelVersionOutput, **REFUSALS})
    def post(self, request, version_id: int):
        version = registry.model_version_for_registry(user=request.user, version_id=version_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        version = registry.model_version_register_run(
            version=version, name=data["name"], prompt_format=data["prompt_format"]
        )
        return Response(ModelVersionOutput(version).data, status=status.HTTP_202_ACCEPTED)


class ModelVersionValidateApi(ResearcherApi):
    """Validate a registered version again (its status is pending until the job ends)."""

    @extend_schema(request=None, responses={202: ModelVersionOutput, **REFUSALS})
    def post(self, request, version_id: int):
        version = registry.model_version_for_registry(user=request.user, version_id=version_id)
        version = registry.model_version_revalidate(version=version)
        return Response(ModelVersionOutput(version).data, status=status.HTTP_202_ACCEPTED)
