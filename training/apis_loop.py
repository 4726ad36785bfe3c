"""REST API of a project's loop: its settings and state, its timeline, and the actions on it.

For the project's researchers and staff (`annotation.access.project_for`, role manager): a
project the caller cannot see is a 404, one they only annotate or review is a 403. A model
version is decided on by the researchers of the project it belongs to; a version of another
project is a 404, as if it did not exist. Settings name models by ids of the project, never
by path (`training.loop.control.loop_settings_validate`).
"""

from __future__ import annotations

from dataclasses import asdict

from drf_spectacular.utils import extend_schema, extend_schema_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from annotation import access
from annotation.errors import ServiceError
from training import selectors
from training.apis import ModelVersionOutput, ResearcherApi
from training.loop import control
from training.loop.timeline import loop_timeline


class LoopOutput(serializers.Serializer):
    project_id = serializers.IntegerField()
    has_loop = serializers.BooleanField(help_text="False until its settings are first saved.")
    paused = serializers.BooleanField()
    settings = serializers.DictField(help_text="LoopSettings fields.")
    every_seconds = serializers.IntegerField(
        allow_null=True, help_text="Beat schedule interval, null when not scheduled."
    )
    schedule_enabled = serializers.BooleanField(allow_null=True)
    last_tick_at = serializers.DateTimeField(allow_null=True)
    last_tick_status = serializers.CharField(help_text="done, failed, paused or empty.")
    last_error = serializers.CharField(help_text="The last failed tick's error or traceback.")
    last_steps = serializers.ListField(child=serializers.DictField())


@extend_schema_serializer(component_name="LoopTimelineStep")
class TimelineStepOutput(serializers.Serializer):
    kind = serializers.CharField(
        help_text="round, export, train, model, evaluate, gate or next_round"
    )
    title = serializers.CharField()
    status = serializers.CharField()
    detail = serializers.CharField()
    error = serializers.CharField()
    progress = serializers.FloatField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    duration_seconds = serializers.FloatField(allow_null=True)
    round_number = serializers.IntegerField(allow_null=True)
    dataset_version = serializers.IntegerField(allow_null=True)
    run_id = serializers.IntegerField(allow_null=True)
    model_version_id = serializers.IntegerField(allow_null=True)
    active = serializers.BooleanField(help_text="Still moving (queued, running, labelling).")


class IterationOutput(serializers.Serializer):
    key = serializers.CharField(help_text="loop-<project>-r<round it learns from>")
    round_number = serializers.IntegerField()
    steps = TimelineStepOutput(many=True)


class LoopEventOutput(serializers.Serializer):
    key = serializers.CharField()
    step = serializers.CharField()
    status = serializers.CharField()
    detail = serializers.CharField()
    started_at = serializers.DateTimeField(allow_null=True)
    duration_seconds = serializers.FloatField(allow_null=True)
    round_number = serializers.IntegerField(allow_null=True)
    run_id = serializers.IntegerField(allow_null=True)
    model_version_id = serializers.IntegerField(allow_null=True)


class TimelineOutput(LoopOutput):
    active = serializers.BooleanField(help_text="Something is still moving: poll again.")
    iterations = IterationOutput(many=True, help_text="Newest round first.")
    events = LoopEventOutput(many=True, help_text="The newest recorded steps.")


def _project(request, project_id: int):
    return access.project_for(user=request.user, project_id=project_id, role=access.MANAGER)


def _timeline_data(project) -> dict:
    timeline = loop_timeline(project=project)
    return {**asdict(timeline), "active": timeline.active}


class LoopApi(ResearcherApi):
    """A project's loop settings and state; PUT saves settings (creating the loop)."""

    @extend_schema_serializer(component_name="LoopSettingsInput")
    class InputSerializer(serializers.Serializer):
        settings = serializers.DictField(
            help_text="LoopSettings fields to change; the first save must choose 'path'."
        )
        every_seconds = serializers.IntegerField(
            required=False,
            allow_null=True,
            help_text="Tick the loop on a beat schedule every this many seconds.",
        )

    @extend_schema(responses=LoopOutput)
    def get(self, request, project_id: int):
        project = _project(request, project_id)
        return Response(LoopOutput(_timeline_data(project)).data)

    @extend_schema(request=InputSerializer, responses=LoopOutput)
    def put(self, request, project_id: int):
        project = _project(request, project_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        control.loop_update(
            project=project,
            settings=serializer.validated_data["settings"],
            user=request.user,
            every_seconds=serializer.validated_data.get("every_seconds"),
        )
        return Response(LoopOutput(_timeline_data(project)).data)


class LoopTimelineApi(ResearcherApi):
    """The loop's iterations: round -> dataset -> runs -> models -> evaluation -> gate -> next."""

    @extend_schema(responses=TimelineOutput)
    def get(self, request, project_id: int):
        project = _project(request, project_id)
        return Response(TimelineOutput(_timeline_data(project)).data)


class LoopStepApi(ResearcherApi):
    """Queue a tick now: the loop advances as far as it can (slow steps on the gpu queue)."""

    @extend_schema_serializer(component_name="LoopStepInput")
    class InputSerializer(serializers.Serializer):
        force = serializers.BooleanField(
            default=False, help_text="Start even if the round has fewer labels than required."
        )

    @extend_schema(request=InputSerializer, responses={202: LoopOutput})
    def post(self, request, project_id: int):
        project = _project(request, project_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        control.loop_step_queue(project=project, force=serializer.validated_data["force"])
        return Response(LoopOutput(_timeline_data(project)).data, status=status.HTTP_202_ACCEPTED)


class LoopPauseApi(ResearcherApi):
    """Pause the loop: no tick advances it (its beat schedule is disabled too)."""

    paused = True

    @extend_schema(request=None, responses=LoopOutput)
    def post(self, request, project_id: int):
        project = _project(request, project_id)
        control.loop_pause(project=project, paused=self.paused)
        return Response(LoopOutput(_timeline_data(project)).data)


class LoopResumeApi(LoopPauseApi):
    """Resume the loop (and its beat schedule)."""

    paused = False


class ModelVersionDecideApi(ResearcherApi):
    """Promote a policy by hand, with a reason; the next round is generated from it."""

    promote = True

    @extend_schema_serializer(component_name="PolicyDecisionInput")
    class InputSerializer(serializers.Serializer):
        reason = serializers.CharField(
            max_length=2000, allow_blank=True, default="", help_text="Why (stored and shown)."
        )
        project_id = serializers.IntegerField(
            required=False, help_text="Optional: must be the version's own project."
        )

    @extend_schema(request=InputSerializer, responses=ModelVersionOutput)
    def post(self, request, version_id: int):
        version = selectors.model_version_list(user=request.user).filter(pk=version_id).first()
        if version is None:
            raise NotFound("No such model version.")
        project_id = selectors.model_version_project_id(version=version)
        if project_id is None:
            raise NotFound("No such model version.")
        project = _project(request, project_id)
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if "project_id" in data and data["project_id"] != project.pk:
            error = ServiceError("project_id: not the project of this model version.")
            error.field = "project_id"
            raise error
        version = control.loop_policy_for(project=project, version_id=version.pk, user=request.user)
        version = control.loop_policy_decide(
            version=version, user=request.user, promote=self.promote, reason=data["reason"]
        )
        return Response(ModelVersionOutput(version).data)


class ModelVersionRejectApi(ModelVersionDecideApi):
    """Reject a policy by hand, with a reason: it stays in the registry, no round uses it."""

    promote = False
