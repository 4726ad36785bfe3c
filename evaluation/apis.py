"""QC REST API under /api/qc/: agreement, annotator quality, policy, review queue, adjudication.

Object permissions: figures and labels are for the project's reviewers and researchers
(staff see every project); the annotator table, policy, resume and checks for researchers.
Outside the project the answer is 404, inside it without the role 403, so annotators never
see other people's labels.
"""

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from annotation import access, errors
from annotation.models import Membership, Round
from annotation.pagination import paginate
from evaluation import review, selectors, services
from evaluation.agreement_cache import project_agreement_cached
from evaluation.models import AnnotatorAssessment
from evaluation.tasks import qc_check_project_task

MAX_BOOT = 5000


class AgreementApi(APIView):
    class QuerySerializer(serializers.Serializer):
        round = serializers.IntegerField(required=False, min_value=1)
        live = serializers.BooleanField(required=False, default=False)
        n_boot = serializers.IntegerField(
            required=False, default=200, min_value=0, max_value=MAX_BOOT
        )
        seed = serializers.IntegerField(required=False, default=0, min_value=0, max_value=2**32 - 1)

    @extend_schema(
        parameters=[
            OpenApiParameter("round", int, description="Round number (default: all rounds)."),
            OpenApiParameter(
                "live",
                bool,
                description="Compute now instead of the stored one (cached until labels change).",
            ),
            OpenApiParameter("n_boot", int, description=f"Bootstrap replicates (<= {MAX_BOOT})."),
            OpenApiParameter("seed", int),
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.REVIEWER)
        query = self.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        round_ = None
        if params.get("round"):
            round_ = get_object_or_404(Round, project=project, number=params["round"])
        if not params["live"]:
            stored = selectors.agreement_report_latest(project=project, round_=round_)
            if stored is not None:
                return Response(
                    {"stored": True, "computed_at": stored.created_at, "report": stored.report}
                )
        report = project_agreement_cached(
            project=project, round_=round_, n_boot=params["n_boot"], seed=params["seed"]
        )
        return Response({"stored": False, "computed_at": None, "report": report})


class LabelDistributionApi(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("round", int, description="Round number.")],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.REVIEWER)
        round_ = None
        if request.query_params.get("round"):
            round_ = get_object_or_404(
                Round, project=project, number=_int(request.query_params["round"])
            )
        return Response(selectors.label_distribution(project=project, round_=round_))


class AnnotatorQualityApi(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        rows = selectors.annotator_quality_table(project=project)
        return paginate(request=request, view=self, rows=rows)


class AssessmentOutput(serializers.ModelSerializer):
    class Meta:
        model = AnnotatorAssessment
        fields = [
            "id",
            "annotator",
            "verdict",
            "applied",
            "failed_checks",
            "reasons",
            "notes",
            "metrics",
            "n_judgments",
            "trigger",
            "created_by",
            "created_at",
        ]


class AnnotatorAssessmentListApi(APIView):
    @extend_schema(responses=AssessmentOutput(many=True))
    def get(self, request, project_id: int, user_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        # Someone who never joined the project is not named here (as resume answers).
        if not Membership.objects.filter(project=project, user_id=user_id).exists():
            raise errors.NotFound("No such annotator in this project.")
        rows = selectors.annotator_assessments(project=project, annotator_id=user_id)
        return Response(AssessmentOutput(rows, many=True).data)


class AnnotatorResumeApi(APIView):
    parser_classes = [JSONParser]

    @extend_schema_serializer(component_name="AnnotatorResumeInput")
    class InputSerializer(serializers.Serializer):
        note = serializers.CharField(required=False, allow_blank=True, default="", max_length=2000)
        clear_labels = serializers.BooleanField(required=False, default=True)

    @extend_schema(request=InputSerializer, responses={200: AssessmentOutput})
    def post(self, request, project_id: int, user_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        assessment = services.annotator_resume(
            project=project, annotator_id=user_id, by=request.user, **serializer.validated_data
        )
        return Response(AssessmentOutput(assessment).data)


class PolicyApi(APIView):
    parser_classes = [JSONParser]

    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        return Response(_policy_json(selectors.quality_policy_get(project=project)))

    @extend_schema(request=OpenApiTypes.OBJECT, responses=OpenApiTypes.OBJECT)
    def patch(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        if not isinstance(request.data, dict):
            return Response({"detail": "Send a JSON object.", "code": "policy"}, status=400)
        # Names from the request become keyword arguments only once known to be policy fields.
        unknown = sorted(str(name) for name in set(request.data) - set(services.POLICY_FIELDS))
        if unknown:
            return Response(
                {"detail": f"Unknown policy fields: {', '.join(unknown)}.", "code": "policy"},
                status=400,
            )
        policy = services.quality_policy_update(project=project, **request.data)
        return Response(_policy_json(policy))


class CheckApi(APIView):
    @extend_schema(request=None, responses={202: OpenApiTypes.OBJECT})
    def post(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        qc_check_project_task.delay(project.pk, AnnotatorAssessment.Trigger.API)
        return Response({"queued": True, "project_id": project.pk}, status=status.HTTP_202_ACCEPTED)


class DisagreementQueueApi(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("limit", int), OpenApiParameter("offset", int)],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.REVIEWER)
        limit = min(max(_int(request.query_params.get("limit", 100)), 1), 500)
        offset = max(_int(request.query_params.get("offset", 0)), 0)
        return Response(selectors.disagreement_queue(project=project, limit=limit, offset=offset))


class ReviewItemApi(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request, item_id: int):
        item = services.item_for_review(item_id=item_id, user=request.user)
        return Response(selectors.review_item(item=item))


class AdjudicationCreateApi(APIView):
    parser_classes = [JSONParser]

    @extend_schema_serializer(component_name="AdjudicationInput")
    class InputSerializer(serializers.Serializer):
        choice = serializers.CharField(max_length=16, required=False, allow_null=True, default=None)
        ranking = serializers.ListField(
            child=serializers.IntegerField(),
            required=False,
            allow_null=True,
            default=None,
            max_length=8,
        )
        note = serializers.CharField(
            required=False, allow_blank=True, default="", max_length=10_000
        )

    @extend_schema(request=InputSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request, item_id: int):
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        adjudication = services.adjudication_create(
            item_id=item_id, reviewer=request.user, **serializer.validated_data
        )
        return Response(review.adjudication_payload(adjudication), status=status.HTTP_201_CREATED)


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise errors.ServiceError("Expected a whole number.", code="invalid") from None


def _policy_json(policy) -> dict:
    data = {name: getattr(policy, name) for name in services.POLICY_FIELDS}
    data["review_sources"] = policy.sources_for_review()
    data["project_id"] = policy.project_id
    data["stored"] = policy.pk is not None
    return data
