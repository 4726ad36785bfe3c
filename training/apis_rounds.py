"""REST endpoints of generation jobs: a round generated from registered policies.

* ``POST /api/training/projects/{id}/generation-jobs/`` — ``{policies: [ids], mode:
  "k_samples" | "side_by_side", n_prompts, sampling: [{temperature, top_p, top_k,
  max_new_tokens}, ...], seed, purpose: "train" | "eval", source_key}`` -> 202 with the
  queued job (the same ``source_key`` again returns the first job), or 400 naming the field.
* ``GET /api/training/projects/{id}/generation-jobs/`` — the project's jobs, newest first.
* ``GET /api/training/projects/{id}/generation-jobs/{job}/`` — one job with its progress.

The project's researchers and staff only; a policy is named by id and must be a ready policy
of the project.
"""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from annotation import access
from annotation.models import Round
from annotation.pagination import paginate
from training import rounds
from training.models import GenerationJob


class GenerationJobPolicyOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class GenerationJobOutput(serializers.ModelSerializer):
    # A plain string: the job status enum would collide with the import jobs' in the schema.
    status = serializers.CharField(read_only=True, help_text="queued, running, succeeded or failed")
    policies = serializers.SerializerMethodField()
    round_number = serializers.SerializerMethodField(help_text="The round it opened, when done.")
    status_url = serializers.SerializerMethodField()

    class Meta:
        model = GenerationJob
        fields = [
            "id",
            "status",
            "progress",
            "error",
            "request",
            "policies",
            "n_prompts",
            "n_items",
            "round_number",
            "created_at",
            "started_at",
            "finished_at",
            "status_url",
        ]

    @extend_schema_field(GenerationJobPolicyOutput(many=True))
    def get_policies(self, job: GenerationJob) -> list[dict]:
        names = {v.pk: v.name for v in job.policies.all()}
        return [{"id": pk, "name": names.get(pk, "")} for pk in job.request.get("policies", [])]

    def get_round_number(self, job: GenerationJob) -> int | None:
        return job.round.number if job.round_id else None

    def get_status_url(self, job: GenerationJob) -> str:
        return reverse("api-generation-job", args=[job.project_id, job.pk])


class GenerationJobListApi(APIView):
    parser_classes = [JSONParser]

    @extend_schema_serializer(component_name="GenerationJobInput")
    class InputSerializer(serializers.Serializer):
        policies = serializers.ListField(
            child=serializers.IntegerField(), help_text="Ids of ready policies of the project."
        )
        mode = serializers.ChoiceField(choices=rounds.MODES, default="k_samples")
        n_prompts = serializers.IntegerField(help_text="Prompts drawn from the pool.")
        sampling = serializers.ListField(
            child=serializers.DictField(),
            required=False,
            default=list,
            help_text="One settings object for all candidates, or one per candidate.",
        )
        seed = serializers.IntegerField(required=False, default=0)
        purpose = serializers.ChoiceField(choices=Round.Purpose.values, default="train")
        source_key = serializers.CharField(
            required=False,
            default="",
            allow_blank=True,
            help_text="Idempotency key: the same key returns the first job.",
        )

    @extend_schema(responses=GenerationJobOutput(many=True))
    def get(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        jobs = (
            GenerationJob.objects.filter(project=project)
            .select_related("round")
            .prefetch_related("policies")
            .order_by("-created_at", "-id")
        )
        return paginate(request=request, view=self, rows=jobs, serializer_class=GenerationJobOutput)

    @extend_schema(request=InputSerializer, responses={202: GenerationJobOutput})
    def post(self, request, project_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        job = rounds.generation_job_create(project=project, user=request.user, **serializer.data)
        return Response(GenerationJobOutput(job).data, status=status.HTTP_202_ACCEPTED)


class GenerationJobDetailApi(APIView):
    @extend_schema(responses=GenerationJobOutput)
    def get(self, request, project_id: int, generation_job_id: int):
        project = access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)
        job = rounds.generation_job_get(project=project, job_id=generation_job_id)
        return Response(GenerationJobOutput(job).data)
