"""REST API of training runs and the model registry (staff and project researchers only).

One view per operation: validate, call one service, render. A run or model version of a
project the caller does not research is answered 404, as if it did not exist.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from annotation import access
from annotation.models import Project
from annotation.pagination import BoundedLimitOffsetPagination
from training import config_policy, selectors, services
from training.models import ModelVersion, Recipe, TrainingRun


class IsResearcher(BasePermission):
    message = "Only staff and project researchers may use training."

    def has_permission(self, request, view) -> bool:
        return selectors.user_is_researcher(user=request.user)


class ResearcherApi(APIView):
    permission_classes = [IsAuthenticated, IsResearcher]


def _run_for_user(run_id: int, user) -> TrainingRun:
    run = selectors.training_run_get(user=user, run_id=run_id)
    if run is None:
        raise NotFound("No such training run.")
    return run


def _check_can_manage(run: TrainingRun, user) -> None:
    if user.is_staff:
        return
    if run.project_id is None or not access.user_can_manage(project_id=run.project_id, user=user):
        raise PermissionDenied("Only the project's researchers may do this.")


class TrainingRunOutput(serializers.ModelSerializer):
    # A plain string here, the enum on the detail: one component owns the status enum, so
    # the schema names it instead of hashing a name for a collision.
    status = serializers.CharField(
        read_only=True, help_text="queued, running, succeeded, failed or cancelled"
    )
    model_version_id = serializers.SerializerMethodField()

    class Meta:
        model = TrainingRun
        fields = [
            "id",
            "recipe",
            "status",
            "progress",
            "current_metrics",
            "project",
            "dataset_version",
            "base_model",
            "base_model_path",
            "output_dir",
            "checkpoint_path",
            "attempts",
            "created_at",
            "started_at",
            "finished_at",
            "heartbeat_at",
            "model_version_id",
        ]

    def get_model_version_id(self, run: TrainingRun) -> int | None:
        version = getattr(run, "model_version", None)
        return version.pk if version is not None else None


class TrainingRunDetailOutput(TrainingRunOutput):
    status = serializers.ChoiceField(choices=TrainingRun.Status.choices, read_only=True)

    class Meta(TrainingRunOutput.Meta):
        fields = [
            *TrainingRunOutput.Meta.fields,
            "config",
            "dataset_path",
            "log_tail",
            "error",
            "exit_code",
            "resumes",
            "worker_host",
        ]


class ModelVersionOutput(serializers.ModelSerializer):
    lineage = serializers.SerializerMethodField()
    project = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = [
            "id",
            "name",
            "kind",
            "artifact_path",
            "base_model_path",
            "parent",
            "training_run",
            "dataset_version",
            "project",
            "eval_results",
            "endpoint_name",
            "endpoint_model",
            "lineage",
            "created_at",
            # Registry: usable only when status is ready (training/registry.py).
            "status",
            "source",
            "validation",
            "validation_error",
        ]

    def get_lineage(self, version: ModelVersion) -> list[str]:
        """Names from this version back to its oldest ancestor, then the base model path."""
        chain = selectors.model_version_lineage(version=version)
        names = [item.name for item in chain]
        if chain[-1].base_model_path:
            names.append(chain[-1].base_model_path)
        return names

    def get_project(self, version: ModelVersion) -> int | None:
        return selectors.model_version_project_id(version=version)


class TrainingRunListApi(ResearcherApi):
    @extend_schema_serializer(component_name="TrainingRunInput")
    class InputSerializer(serializers.Serializer):
        recipe = serializers.ChoiceField(choices=Recipe.choices)
        config = serializers.DictField(default=dict)
        project_id = serializers.IntegerField(required=False)
        dataset_version_id = serializers.IntegerField(required=False)
        dataset_path = serializers.CharField(required=False, max_length=500)
        base_model_id = serializers.IntegerField(required=False)
        base_model_path = serializers.CharField(required=False, max_length=500, default="")

        def validate(self, attrs):
            if ("dataset_version_id" in attrs) == ("dataset_path" in attrs):
                raise serializers.ValidationError(
                    "Give exactly one of dataset_version_id and dataset_path."
                )
            return attrs

    @extend_schema(responses=TrainingRunOutput(many=True))
    def get(self, request):
        project_id = request.query_params.get("project")
        runs = selectors.training_run_list(
            user=request.user,
            project_id=int(project_id) if project_id and project_id.isdigit() else None,
            status=request.query_params.get("status", ""),
        ).select_related("model_version")
        paginator = BoundedLimitOffsetPagination()
        page = paginator.paginate_queryset(runs, request, view=self)
        return paginator.get_paginated_response(TrainingRunOutput(page, many=True).data)

    @extend_schema(request=InputSerializer, responses={201: TrainingRunDetailOutput})
    def post(self, request):
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        user = request.user

        # Ids a caller may not see answer 404, as if they did not exist.
        dataset_version = None
        if "dataset_version_id" in data:
            dataset_version = selectors.dataset_version_for_user(
                user=user, dataset_version_id=data["dataset_version_id"]
            )
            if dataset_version is None:
                raise NotFound("dataset_version_id: no such dataset version.")
        elif not user.is_staff:
            raise PermissionDenied("Only staff may train on a dataset path.")

        project = None
        project_id = data.get("project_id") or (
            dataset_version.project_id if dataset_version is not None else None
        )
        if project_id is not None:
            project = Project.objects.filter(pk=project_id).first()
            if project is None:
                raise NotFound("project_id: no such project.")
        if not user.is_staff and (
            project is None or not access.user_can_manage(project_id=project.pk, user=user)
        ):
            raise PermissionDenied("Only the project's researchers may train on its data.")

        base_model = None
        if "base_model_id" in data:
            base_model = config_policy.model_version_for_run(
                user=user, project=project, version_id=data["base_model_id"], field="base_model_id"
            )
        if data["base_model_path"] and not user.is_staff:
            raise PermissionDenied("Only staff may start from a model path.")

        run = services.training_run_create(
            recipe=data["recipe"],
            config=data["config"],
            dataset_version=dataset_version,
            dataset_path=data.get("dataset_path"),
            base_model=base_model,
            base_model_path=data["base_model_path"],
            project=project,
            user=user,
        )
        return Response(TrainingRunDetailOutput(run).data, status=status.HTTP_201_CREATED)


class TrainingRunDetailApi(ResearcherApi):
    @extend_schema(responses=TrainingRunDetailOutput)
    def get(self, request, run_id: int):
        return Response(TrainingRunDetailOutput(_run_for_user(run_id, request.user)).data)


class TrainingRunCancelApi(ResearcherApi):
    @extend_schema(request=None, responses=TrainingRunDetailOutput)
    def post(self, request, run_id: int):
        run = _run_for_user(run_id, request.user)
        _check_can_manage(run, request.user)
        run = services.training_run_cancel(run_id=run.pk)
        return Response(TrainingRunDetailOutput(run).data)


class TrainingRunResumeApi(ResearcherApi):
    @extend_schema(request=None, responses=TrainingRunDetailOutput)
    def post(self, request, run_id: int):
        run = _run_for_user(run_id, request.user)
        _check_can_manage(run, request.user)
        run = services.training_run_resume(run_id=run.pk)
        return Response(TrainingRunDetailOutput(run).data)


class ModelVersionListApi(ResearcherApi):
    @extend_schema(responses=ModelVersionOutput(many=True))
    def get(self, request):
        versions = selectors.model_version_list(
            user=request.user, kind=request.query_params.get("kind", "")
        )
        paginator = BoundedLimitOffsetPagination()
        page = paginator.paginate_queryset(versions, request, view=self)
        return paginator.get_paginated_response(ModelVersionOutput(page, many=True).data)


class ModelVersionDetailApi(ResearcherApi):
    @extend_schema(responses=ModelVersionOutput)
    def get(self, request, version_id: int):
        version = selectors.model_version_list(user=request.user).filter(pk=version_id).first()
        if version is None:
            raise NotFound("No such model version.")
        return Response(ModelVersionOutput(version).data)


class GenerationEndpointListApi(ResearcherApi):
    """The OpenAI-compatible endpoints the deployment declares: names and models, no URLs."""

    @extend_schema_serializer(component_name="GenerationEndpointOutput")
    class OutputSerializer(serializers.Serializer):
        name = serializers.CharField()
        models = serializers.ListField(child=serializers.CharField())

    @extend_schema(responses=OutputSerializer(many=True))
    def get(self, request):
        from training.generation.endpoints import generation_endpoints

        rows = [{"name": p.name, "models": list(p.models)} for p in generation_endpoints().values()]
        return Response(self.OutputSerializer(rows, many=True).data)


class ModelVersionEndpointCreateApi(ResearcherApi):
    """Register a policy served by a declared endpoint, picked by endpoint and model name."""

    @extend_schema_serializer(component_name="EndpointPolicyInput")
    class InputSerializer(serializers.Serializer):
        project_id = serializers.IntegerField(help_text="The project the policy is for.")
        name = serializers.CharField(max_length=200, help_text="Unique name of the version.")
        endpoint = serializers.CharField(
            max_length=100, help_text="A name from GET /api/training/generation-endpoints/."
        )
        model = serializers.CharField(max_length=200, help_text="One of that endpoint's models.")

    @extend_schema(request=InputSerializer, responses={201: ModelVersionOutput})
    def post(self, request):
        from training.generation.endpoints import model_version_endpoint_create

        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        project = access.project_for(
            user=request.user, project_id=data["project_id"], role=access.MANAGER
        )
        version = model_version_endpoint_create(
            name=data["name"], endpoint=data["endpoint"], model=data["model"], project=project
        )
        return Response(ModelVersionOutput(version).data, status=status.HTTP_201_CREATED)
