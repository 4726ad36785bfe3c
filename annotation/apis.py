"""REST API: one view per operation, thin: validate, call one service, render.

Annotator-facing responses never carry model names, checkpoints, gold flags, assignment
kinds or other people's labels; researcher-only endpoints check the caller's role.
"""

from django.core.exceptions import NON_FIELD_ERRORS
from django.db import DatabaseError, InterfaceError, OperationalError
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, NotFound, PermissionDenied, ValidationError
from rest_framework.parsers import JSONParser, MultiPartParser
from rest_framework.response import Response
from rest_framework.settings import api_settings as drf_api_settings
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from annotation import access, errors, inputs, projects, selectors, services, views
from annotation.apis_imports import (
    ImportJobOutput,
    UploadField,
    declared_upload_too_large,
    import_now_or_queue,
)
from annotation.fastpath import FastApiView
from annotation.imports import items_import
from annotation.models import Membership, Project, Round, TaskKind
from annotation.pagination import paginate
from annotation.serving import assignment_prefetch, assignment_release


class ServiceUnavailable(APIException):
    status_code = 503
    default_detail = "The database is unavailable; retry with the same idempotency key."
    default_code = "retry"


def exception_handler(exc, context):
    """Turn service errors into 4xx JSON and lost database connections into a retryable 503."""
    if isinstance(exc, errors.ServiceError):
        body = {"detail": exc.message, "code": exc.code}
        if getattr(exc, "field", ""):  # e.g. training.config_policy names the refused field
            body["field"] = exc.field
        return Response(body, status=exc.status)
    if isinstance(exc, OperationalError | InterfaceError) or (
        isinstance(exc, DatabaseError) and "connection" in str(exc).lower()
    ):
        response = Response(
            {"detail": ServiceUnavailable.default_detail, "code": "retry"}, status=503
        )
        response["Retry-After"] = "1"
        return response
    return drf_exception_handler(exc, context)


class ProjectOutput(serializers.ModelSerializer):
    class Meta:
        model = Project
        fields = [
            "id",
            "name",
            "rubric",
            "task_kind",
            "k",
            "allow_tie",
            "allow_both_bad",
            "ask_strength",
            "ask_confidence",
            "ask_rationale",
        ]


class ProjectResearcherOutput(serializers.ModelSerializer):
    class Meta:
        model = Project
        # Every setting a researcher chooses (listed once, in annotation.projects), then the
        # server's own fields.
        fields = ["id", *projects.PROJECT_SETTINGS, "archived", "created_at"]


class MembershipOutput(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField()
    status = serializers.CharField()


class RoundStatusOutput(serializers.Serializer):
    number = serializers.IntegerField()
    status = serializers.CharField()


class ImportReportOutput(serializers.Serializer):
    items_created = serializers.IntegerField()
    prompts_created = serializers.IntegerField()
    prompts_reused = serializers.IntegerField()
    candidates_created = serializers.IntegerField()
    candidates_reused = serializers.IntegerField()
    duplicate_prompts_in_file = serializers.IntegerField()
    duplicate_pairs_in_file = serializers.IntegerField()
    round_id = serializers.IntegerField()
    notes = serializers.ListField(child=serializers.CharField())


class ImportErrorsOutput(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.CharField()
    errors = serializers.ListField(child=serializers.DictField())


class PromptPayload(serializers.Serializer):
    text = serializers.CharField()
    messages = serializers.ListField(child=serializers.DictField(), allow_null=True)


class CandidatePayload(serializers.Serializer):
    slot = serializers.CharField()
    text = serializers.CharField()


class AssignmentOutput(serializers.Serializer):
    assignment_id = serializers.IntegerField()
    project_id = serializers.IntegerField()
    lease_expires = serializers.DateTimeField()
    prompt = PromptPayload()
    candidates = CandidatePayload(many=True)


class SubmitOutput(serializers.Serializer):
    judgment_id = serializers.IntegerField()
    replayed = serializers.BooleanField()


class NextError(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.CharField()


class SubmitNextOutput(SubmitOutput):
    next = AssignmentOutput(allow_null=True)
    next_error = NextError(required=False)
    ahead = AssignmentOutput(allow_null=True, required=False)


class AssignmentStatusOutput(serializers.Serializer):
    assignment_id = serializers.IntegerField()
    status = serializers.CharField()


class HeartbeatOutput(serializers.Serializer):
    lease_expires = serializers.DateTimeField()


class ProgressOutput(serializers.Serializer):
    project_id = serializers.IntegerField()
    open_rounds = serializers.IntegerField()
    items = serializers.IntegerField()
    items_complete = serializers.IntegerField()
    judgments_needed = serializers.IntegerField()
    judgments_done = serializers.IntegerField()
    fraction_complete = serializers.FloatField()
    my_judgments = serializers.IntegerField()


def _drf_problems(problems: dict[str, str]) -> dict[str, list[str]]:
    non_field = drf_api_settings.NON_FIELD_ERRORS_KEY
    return {non_field if f == NON_FIELD_ERRORS else f: [text] for f, text in problems.items()}


class ProjectListApi(APIView):
    @extend_schema_serializer(component_name="ProjectListInput")
    class InputSerializer(serializers.ModelSerializer):
        class Meta:
            model = Project
            fields = list(projects.PROJECT_SETTINGS)

        def validate(self, attrs):
            problems = projects.project_problems(settings=attrs)
            if problems:
                raise serializers.ValidationError(_drf_problems(problems))
            return attrs

    @extend_schema(responses=ProjectOutput(many=True))
    def get(self, request):
        projects = access.project_list_for_user(user=request.user).order_by("name", "pk")
        return paginate(request=request, view=self, rows=projects, serializer_class=ProjectOutput)

    @extend_schema(request=InputSerializer, responses=ProjectResearcherOutput)
    def post(self, request):
        if not request.user.is_staff:
            raise PermissionDenied("Only staff may create projects.")
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project = projects.project_create(
            settings=serializer.validated_data, researcher=request.user
        )
        return Response(ProjectResearcherOutput(project).data, status=status.HTTP_201_CREATED)


class ProjectDetailApi(APIView):
    @extend_schema(responses=ProjectOutput)
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id)
        if access.user_can_manage(project_id=project.pk, user=request.user):
            return Response(ProjectResearcherOutput(project).data)
        return Response(ProjectOutput(project).data)


class MembershipApi(APIView):
    @extend_schema_serializer(component_name="MembershipInput")
    class InputSerializer(serializers.Serializer):
        username = serializers.CharField(max_length=150)
        role = serializers.ChoiceField(choices=Membership.Role.choices, default="annotator")

    @extend_schema(request=InputSerializer, responses={201: MembershipOutput})
    def post(self, request, project_id: int):
        from django.contrib.auth import get_user_model

        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = get_user_model().objects.filter(username=serializer.validated_data["username"])
        if not user.exists():
            raise NotFound("No such user.")
        membership = services.membership_set(
            project=project, user=user.get(), role=serializer.validated_data["role"]
        )
        return Response(
            {
                "username": membership.user.username,
                "role": membership.role,
                "status": membership.status,
            },
            status=status.HTTP_201_CREATED,
        )


class RoundListApi(APIView):
    @extend_schema_serializer(component_name="RoundOutput")
    class OutputSerializer(serializers.ModelSerializer):
        class Meta:
            model = Round
            fields = ["id", "number", "status", "model_version", "created_at", "closed_at"]

    @extend_schema(responses=OutputSerializer(many=True))
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        rounds = project.rounds.order_by("number")
        return paginate(
            request=request, view=self, rows=rounds, serializer_class=self.OutputSerializer
        )

    @extend_schema(request=None, responses=OutputSerializer)
    def post(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        round_ = services.round_create(project=project)
        return Response(self.OutputSerializer(round_).data, status=status.HTTP_201_CREATED)


class RoundCloseApi(APIView):
    @extend_schema(request=None, responses=RoundStatusOutput)
    def post(self, request, project_id: int, number: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        round_ = get_object_or_404(Round, project=project, number=number)
        services.round_close(round_=round_)
        return Response({"number": round_.number, "status": round_.status})


class ImportApi(APIView):
    parser_classes = [MultiPartParser]

    @extend_schema_serializer(component_name="ImportInput")
    class InputSerializer(serializers.Serializer):
        file = UploadField()
        format = serializers.ChoiceField(choices=["jsonl", "csv"], required=False)
        round = serializers.IntegerField(required=False)

    @extend_schema(
        request=InputSerializer,
        responses={
            201: ImportReportOutput,
            202: ImportJobOutput,
            400: OpenApiResponse(ImportErrorsOutput),
            413: OpenApiResponse(description="The file is past a size limit (named)."),
        },
    )
    def post(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        refused = declared_upload_too_large(request)
        if refused is not None:
            return refused
        upload = request.data.get("file")
        if not hasattr(upload, "file"):  # missing, or sent as a plain form field
            return Response(
                {"detail": "Send the file as multipart field 'file'.", "code": "file"}, status=400
            )
        is_csv = upload.name.removesuffix(".gz").endswith(".csv")
        fmt = request.data.get("format") or ("csv" if is_csv else "jsonl")
        if fmt not in ("jsonl", "csv"):
            return Response(
                {"detail": "format must be jsonl or csv.", "code": "format"}, status=400
            )
        round_ = None
        if request.data.get("round"):
            number = request.data["round"]
            if not (isinstance(number, str) and number.isascii() and number.isdigit()):
                return Response(
                    {"detail": "round must be a round number.", "code": "round"}, status=400
                )
            round_ = get_object_or_404(Round, project=project, number=int(number))
        return import_now_or_queue(
            request=request,
            project=project,
            kind="items",
            upload=upload,
            options={"format": fmt, "round_id": round_.pk if round_ is not None else None},
            run=lambda stream: (
                items_import(project=project, stream=stream, fmt=fmt, round_=round_).__dict__
            ),
        )


def _assignment_body(request, assignment, *, html: bool) -> dict:
    """Return the blind payload of an assignment; with `html`, the annotator page's item too.

    The item is rendered by the page's own template and context (candidates and prompts go
    through the same escaping Markdown subset), so the page can show it without a request.
    """
    payload = selectors.assignment_payload(assignment=assignment)
    if html:
        project = Project.objects.get(pk=assignment.project_id)
        context = {
            "project": project,
            "options": selectors.project_options(project),
            "is_pairwise": project.task_kind == TaskKind.PAIRWISE,
            **views._item_context(assignment=assignment, project=project),
        }
        payload["html"] = render_to_string(
            "annotation/_item.html", context, request=getattr(request, "_request", request)
        )
    return payload


class PrefetchApi(FastApiView):
    """Hold the item after the current one under its own lease (the page shows it at once)."""

    input_spec = inputs.PREFETCH

    @extend_schema(
        request=inputs.PREFETCH.serializer("PrefetchInput"),
        responses={200: AssignmentOutput, 204: OpenApiResponse(description="Nothing left.")},
        description="At most one item is held ahead beside the current one; asking again "
        "renews and returns it. It becomes the current item when the current one is "
        "submitted with `next`, or when `next` finds no current item.",
    )
    def post(self, request, project_id: int):
        return super().post(request, project_id=project_id)

    def answer(self, request, data, *, project_id: int):
        assignment = assignment_prefetch(project_id=project_id, user=request.user)
        if assignment is None:
            return status.HTTP_204_NO_CONTENT, None
        return status.HTTP_200_OK, _assignment_body(request, assignment, html=data["html"])


class ReleaseApi(FastApiView):
    """Give back an item held ahead, e.g. when the annotator page is left."""

    @extend_schema(request=None, responses=AssignmentStatusOutput)
    def post(self, request, assignment_id: int):
        return super().post(request, assignment_id=assignment_id)

    def answer(self, request, data, *, assignment_id: int):
        assignment = assignment_release(assignment_id=assignment_id, user=request.user)
        return status.HTTP_200_OK, {"assignment_id": assignment.pk, "status": assignment.status}


class NextApi(FastApiView):
    @extend_schema(
        request=None,
        responses={200: AssignmentOutput, 204: OpenApiResponse(description="Nothing left.")},
    )
    def post(self, request, project_id: int):
        return super().post(request, project_id=project_id)

    def answer(self, request, data, *, project_id: int):
        assignment = services.assignment_next(project_id=project_id, user=request.user)
        if assignment is None:
            return status.HTTP_204_NO_CONTENT, None
        return status.HTTP_200_OK, selectors.assignment_payload(assignment=assignment)


class SubmitApi(FastApiView):
    parser_classes = [JSONParser]
    input_spec = inputs.SUBMIT

    @extend_schema(
        request=inputs.SUBMIT.serializer("SubmitInput"),
        responses={200: SubmitNextOutput, 201: SubmitNextOutput},
        description='With `"next": true` the answer carries `next`: the assignment `next` '
        "would serve now, or null when nothing is left (then `next_error` says why when the "
        "annotator is paused or out of skips). A replay returns the same next assignment "
        "while its lease is live.",
    )
    def post(self, request, assignment_id: int):
        return super().post(request, assignment_id=assignment_id)

    def answer(self, request, data, *, assignment_id: int):
        fields = dict(data)
        serve_next, serve_ahead = fields.pop("next"), fields.pop("ahead")
        html = fields.pop("html")
        if serve_ahead and not serve_next:
            raise ValidationError({"ahead": ['ahead needs "next": true.']})
        result = services.judgment_submit(
            assignment_id=assignment_id,
            user=request.user,
            serve_next=serve_next,
            serve_ahead=serve_ahead,
            **fields,
        )
        body = {"judgment_id": result.judgment.pk, "replayed": result.replayed}
        if serve_next:
            following, ahead = result.next_assignment, result.ahead_assignment
            body["next"] = (
                None if following is None else _assignment_body(request, following, html=html)
            )
            if serve_ahead:
                body["ahead"] = (
                    None if ahead is None else _assignment_body(request, ahead, html=html)
                )
            if result.next_error is not None:
                body["next_error"] = {
                    "detail": result.next_error.message,
                    "code": result.next_error.code,
                }
        return (status.HTTP_200_OK if result.replayed else status.HTTP_201_CREATED), body


class SkipApi(APIView):
    @extend_schema_serializer(component_name="SkipInput")
    class InputSerializer(serializers.Serializer):
        reason = serializers.CharField(max_length=500)

    @extend_schema(request=InputSerializer, responses=AssignmentStatusOutput)
    def post(self, request, assignment_id: int):
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assignment = services.assignment_skip(
            assignment_id=assignment_id, user=request.user, **serializer.validated_data
        )
        return Response({"assignment_id": assignment.pk, "status": assignment.status})


class HeartbeatApi(FastApiView):
    @extend_schema(request=None, responses=HeartbeatOutput)
    def post(self, request, assignment_id: int):
        return super().post(request, assignment_id=assignment_id)

    def answer(self, request, data, *, assignment_id: int):
        assignment = services.assignment_heartbeat(assignment_id=assignment_id, user=request.user)
        return status.HTTP_200_OK, {"lease_expires": assignment.lease_expires.isoformat()}


class ProgressApi(APIView):
    @extend_schema(responses=ProgressOutput)
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id)
        return Response(selectors.project_progress(project=project, user=request.user))
