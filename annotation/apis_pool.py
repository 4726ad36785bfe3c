"""REST endpoints of a project's prompt pool: its researchers and staff only.

* ``POST /api/projects/{id}/prompts/import/`` — multipart ``file`` (``.jsonl`` or
  ``.jsonl.gz``) and optional ``eval_fraction``; or the JSON lines themselves as the body
  (``Content-Type: application/jsonl``, ``eval_fraction`` in the query string) -> 201 with
  the counts, 400 listing every bad line (nothing imported), 413 past the size limit.
* ``GET /api/projects/{id}/prompts/`` — the pool, newest first, ``?split=train|eval``,
  ``?tag=``; bounded pages (``limit``, ``offset``; total in ``X-Total-Count``).
* ``GET /api/projects/{id}/prompts/counts/`` — the pool's size by split and its tags.

Pool files are imported in the request, up to IMPORT_ASYNC_BYTES; a larger file goes
through ``manage.py import_prompts``.
"""

from __future__ import annotations

import gzip
import io
import zlib

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_serializer,
)
from rest_framework import serializers, status
from rest_framework.parsers import BaseParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from annotation import access, prompt_pool
from annotation.apis_imports import UploadField, import_failed, too_large
from annotation.errors import ServiceError
from annotation.imports import ImportFailed, ImportTooLarge, size_text
from annotation.imports.jobs import open_import_file
from annotation.models import Project, Prompt
from annotation.pagination import paginate


class JsonLinesParser(BaseParser):
    """Take a JSON lines body as it is, refusing it past the in-request import limit."""

    media_type = "application/jsonl"

    def parse(self, stream, media_type=None, parser_context=None) -> dict:
        limit = settings.IMPORT_ASYNC_BYTES
        data = stream.read(limit + 1) if stream is not None else b""
        return {"body": io.BytesIO(data), "too_large": len(data) > limit}


class NdJsonParser(JsonLinesParser):
    media_type = "application/x-ndjson"


class PoolImportReportOutput(serializers.Serializer):
    added = serializers.IntegerField(help_text="New prompts added to the pool.")
    joined_from_rounds = serializers.IntegerField(
        help_text="Prompts the project had from its rounds that joined the pool."
    )
    already_in_pool = serializers.IntegerField(help_text="Prompts already in the pool (kept).")
    duplicates_in_file = serializers.IntegerField(help_text="Lines repeating an earlier prompt.")
    train = serializers.IntegerField(help_text="This file's distinct prompts in the train split.")
    eval = serializers.IntegerField(help_text="This file's distinct prompts in the eval split.")
    eval_fraction = serializers.FloatField()
    pool_train = serializers.IntegerField(help_text="The whole pool's train split after.")
    pool_eval = serializers.IntegerField(help_text="The whole pool's eval split after.")


class PoolPromptOutput(serializers.ModelSerializer):
    class Meta:
        model = Prompt
        fields = ["id", "text", "messages", "split", "tags", "external_id", "created_at"]


class PoolCountsOutput(serializers.Serializer):
    total = serializers.IntegerField()
    train = serializers.IntegerField()
    eval = serializers.IntegerField()
    tags = serializers.DictField(child=serializers.IntegerField(), help_text="Prompts per tag.")


def pool_import_response(*, project: Project, stream, eval_fraction) -> Response:
    """Run a pool import and answer 201 with its counts, or the 4xx that names the problem."""
    try:
        report = prompt_pool.prompt_pool_import(
            project=project, stream=stream, eval_fraction=eval_fraction
        )
    except ImportFailed as exc:
        return import_failed(exc)
    except ImportTooLarge as exc:
        return too_large(exc.message, limit=exc.limit)
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        return Response(
            {"detail": f"cannot read the file: {exc}", "code": "file", "field": "file"},
            status=status.HTTP_400_BAD_REQUEST,
        )
    return Response(report.as_dict(), status=status.HTTP_201_CREATED)


def _eval_fraction(raw) -> float:
    if raw in (None, ""):
        return prompt_pool.DEFAULT_EVAL_FRACTION
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    return prompt_pool.eval_fraction_check(value)


def pool_too_large() -> Response:
    """Return the 413 of a pool upload above the in-request limit, naming the command."""
    limit = settings.IMPORT_ASYNC_BYTES
    return too_large(
        f"A prompt pool upload may be up to {size_text(limit)}; nothing was imported. "
        "Split the file, or import it with manage.py import_prompts.",
        limit=limit,
    )


class PromptPoolImportApi(APIView):
    parser_classes = [MultiPartParser, JsonLinesParser, NdJsonParser]

    @extend_schema_serializer(component_name="PromptPoolImportInput")
    class InputSerializer(serializers.Serializer):
        file = UploadField(help_text="JSON lines: prompt or messages, optional tags and id.")
        eval_fraction = serializers.FloatField(
            required=False, help_text="Share of new prompts kept for evaluation (default 0.1)."
        )

    @extend_schema(
        request={"multipart/form-data": InputSerializer, "application/jsonl": OpenApiTypes.STR},
        parameters=[OpenApiParameter("eval_fraction", float, required=False)],
        responses={
            201: PoolImportReportOutput,
            400: OpenApiResponse(description="Every bad line, or the bad field, named."),
            413: OpenApiResponse(description="The file is past the size limit (named)."),
        },
    )
    def post(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        data = request.data
        try:
            if "body" in data:
                if data["too_large"]:
                    return pool_too_large()
                fraction = _eval_fraction(request.query_params.get("eval_fraction"))
                return pool_import_response(
                    project=project, stream=data["body"], eval_fraction=fraction
                )
            upload = data.get("file")
            if not hasattr(upload, "file"):
                return Response(
                    {
                        "detail": "Send the file as multipart field 'file', or the JSON lines "
                        "as the body with Content-Type application/jsonl.",
                        "code": "file",
                        "field": "file",
                    },
                    status=status.HTTP_400_BAD_REQUEST,
                )
            if upload.size > settings.IMPORT_ASYNC_BYTES:
                return pool_too_large()
            fraction = _eval_fraction(data.get("eval_fraction"))
        except ServiceError as exc:
            return Response(
                {"detail": exc.message, "code": "invalid", "field": "eval_fraction"},
                status=status.HTTP_400_BAD_REQUEST,
            )
        return pool_import_response(
            project=project,
            stream=open_import_file(upload.file, upload.name),
            eval_fraction=fraction,
        )


class PromptPoolListApi(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("split", str, enum=Prompt.Split.values, required=False),
            OpenApiParameter("tag", str, required=False),
        ],
        responses=PoolPromptOutput(many=True),
    )
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        split = request.query_params.get("split", "")
        if split and split not in Prompt.Split.values:
            return Response(
                {"detail": "split must be train or eval.", "code": "invalid", "field": "split"},
                status=status.HTTP_400_BAD_REQUEST,
            )
        tag = request.query_params.get("tag", "")
        if "\x00" in tag:
            # No stored tag holds one (PostgreSQL text cannot), and the database refuses it.
            return Response(
                {
                    "detail": "tag must not contain a NUL character.",
                    "code": "invalid",
                    "field": "tag",
                },
                status=status.HTTP_400_BAD_REQUEST,
            )
        rows = prompt_pool.prompt_pool_list(project=project, split=split, tag=tag)
        return paginate(request=request, view=self, rows=rows, serializer_class=PoolPromptOutput)


class PromptPoolCountsApi(APIView):
    @extend_schema(responses=PoolCountsOutput)
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        return Response(prompt_pool.prompt_pool_counts(project=project))
