"""REST endpoints for preference data in and out: researchers and staff only.

* ``POST /api/projects/{id}/import-preferences/`` — multipart ``file`` (``.jsonl`` or
  ``.jsonl.gz``), ``format`` (hh, trl, ranking), optional ``batch``, ``round``, ``serve``,
  ``near_duplicates`` -> 201 report, 400 with every bad line, 413 past a size limit, or 202
  with an import job when the upload is large (see annotation/apis_imports.py).
* ``GET /api/projects/{id}/imports/{job}/`` — a queued import's progress and outcome.
* ``GET /api/projects/{id}/datasets/`` — the project's snapshots.
* ``POST /api/projects/{id}/datasets/`` — ``{name, policy: {...}, sync: false}`` -> 202 with
  the new version (built by a Celery task after commit), or 201 when ``sync``.
* ``GET /api/projects/{id}/datasets/{version}/`` — one snapshot (policies, counts, report).
* ``GET /api/projects/{id}/datasets/{version}/files/{name}`` — download one of its files.
"""

from __future__ import annotations

from django.http import FileResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_serializer,
)
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.parsers import JSONParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from annotation import access, exports, tasks
from annotation.apis_imports import (
    ImportJobOutput,
    UploadField,
    declared_upload_too_large,
    import_now_or_queue,
)
from annotation.imports import FORMATS, preferences_import
from annotation.models import DatasetVersion, ImportJob, Round
from annotation.pagination import paginate


class DatasetFileOutput(serializers.Serializer):
    name = serializers.CharField()
    size = serializers.IntegerField(help_text="Bytes.")
    url = serializers.CharField(help_text="Download link (GET, same authentication).")


class DatasetVersionOutput(serializers.ModelSerializer):
    files = serializers.SerializerMethodField(
        help_text="Every file of a ready snapshot (splits, side files, manifest.json); empty "
        "while it is building or when it failed."
    )

    class Meta:
        model = DatasetVersion
        fields = [
            "id",
            "version",
            "name",
            "format",
            "status",
            "policies",
            "filters",
            "source_rounds",
            "split_counts",
            "content_hash",
            "report",
            "error",
            "created_at",
            "finished_at",
            "files",
        ]

    @extend_schema_field(DatasetFileOutput(many=True))
    def get_files(self, dv: DatasetVersion) -> list[dict]:
        return [
            {
                "name": name,
                "size": size,
                "url": reverse(
                    "api-dataset-file",
                    kwargs={"project_id": dv.project_id, "version": dv.version, "name": name},
                ),
            }
            for name, size in exports.dataset_file_list(dataset_version=dv)
        ]


class PreferenceImportApi(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema_serializer(component_name="PreferenceImportInput")
    class InputSerializer(serializers.Serializer):
        file = UploadField()
        format = serializers.ChoiceField(choices=FORMATS)
        batch = serializers.RegexField(r"^[\w.\-]{1,60}$", required=False, default="")
        round = serializers.IntegerField(required=False, allow_null=True, default=None)
        serve = serializers.BooleanField(required=False, default=False)
        near_duplicates = serializers.BooleanField(required=False, default=False)

    @extend_schema(
        request={"multipart/form-data": InputSerializer},
        responses={
            201: OpenApiTypes.OBJECT,
            202: ImportJobOutput,
            413: OpenApiResponse(description="The file is past a size limit (named)."),
        },
    )
    def post(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        refused = declared_upload_too_large(request)
        if refused is not None:
            return refused
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        round_ = None
        if data["round"] is not None:
            round_ = get_object_or_404(Round, project=project, number=data["round"])
        options = {
            "format": data["format"],
            "batch": data["batch"],
            "round_id": round_.pk if round_ is not None else None,
            "serve": data["serve"],
            "near_duplicates": data["near_duplicates"],
        }

        def run(stream) -> dict:
            return preferences_import(
                project=project,
                stream=stream,
                fmt=data["format"],
                batch=data["batch"],
                round_=round_,
                serve=data["serve"],
                near_duplicates=data["near_duplicates"],
            ).as_dict()

        return import_now_or_queue(
            request=request,
            project=project,
            kind=ImportJob.Kind.PREFERENCES,
            upload=data["file"],
            options=options,
            run=run,
        )


class ImportJobDetailApi(APIView):
    @extend_schema(responses=ImportJobOutput)
    def get(self, request, project_id: int, job_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        job = get_object_or_404(ImportJob, project=project, pk=job_id)
        return Response(ImportJobOutput(job).data)


class DatasetListApi(APIView):
    parser_classes = [JSONParser]

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=200, required=False, default="")
        policy = serializers.DictField(required=False, default=dict)
        sync = serializers.BooleanField(required=False, default=False)

    @extend_schema(responses=DatasetVersionOutput(many=True))
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        versions = DatasetVersion.objects.filter(project=project).order_by("-version")
        return paginate(
            request=request, view=self, rows=versions, serializer_class=DatasetVersionOutput
        )

    @extend_schema(
        request=InputSerializer,
        responses={
            201: DatasetVersionOutput,
            202: DatasetVersionOutput,
            507: OpenApiResponse(description="sync: the snapshot could not be written."),
        },
    )
    def post(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        policy = _export_policy(project=project, data=data["policy"])
        dv = exports.dataset_version_create(
            project=project, policy=policy, name=data["name"], user=request.user
        )
        if data["sync"]:
            try:
                dv = exports.dataset_version_build(dataset_version_id=dv.pk)
            except OSError:  # the version is marked failed with the cause; say it, not 500
                dv.refresh_from_db()
                return Response(
                    {
                        "detail": dv.error.splitlines()[0],
                        "code": "storage",
                        "dataset_version": DatasetVersionOutput(dv).data,
                    },
                    status=status.HTTP_507_INSUFFICIENT_STORAGE,
                )
            return Response(DatasetVersionOutput(dv).data, status=status.HTTP_201_CREATED)
        tasks.build_dataset_version_on_commit(dv.pk)
        return Response(DatasetVersionOutput(dv).data, status=status.HTTP_202_ACCEPTED)


def _export_policy(*, project, data: dict) -> exports.ExportPolicy:
    """Return the checked policy; its round numbers must be rounds of this project."""
    try:
        policy = exports.ExportPolicy.from_dict(data)
    except (TypeError, ValueError) as exc:  # e.g. rounds: ["x"], margins: 5
        raise ValidationError({"policy": [f"invalid policy: {exc}"]}) from None
    if policy.rounds:
        known = set(
            Round.objects.filter(project=project, number__in=policy.rounds).values_list(
                "number", flat=True
            )
        )
        missing = sorted(set(policy.rounds) - known)
        if missing:
            raise ValidationError(
                {"policy": [f"rounds: this project has no round {', '.join(map(str, missing))}."]}
            )
    return policy


class DatasetDetailApi(APIView):
    @extend_schema(responses=DatasetVersionOutput)
    def get(self, request, project_id: int, version: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        dv = get_object_or_404(DatasetVersion, project=project, version=version)
        return Response(DatasetVersionOutput(dv).data)


class DatasetFileApi(APIView):
    @extend_schema(responses={200: bytes})
    def get(self, request, project_id: int, version: int, name: str):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        dv = get_object_or_404(DatasetVersion, project=project, version=version)
        path = exports.dataset_file_path(dataset_version=dv, name=name)
        content_type = "application/json" if name.endswith(".json") else "application/jsonl"
        return FileResponse(
            path.open("rb"), as_attachment=True, filename=name, content_type=content_type
        )
