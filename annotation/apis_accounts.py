"""REST API for API tokens: log in for a token that expires, revoke your own token."""

from axes.helpers import get_cool_off, get_lockout_message
from django.conf import settings
from django.contrib.auth.signals import user_logged_in
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from annotation import accounts


class TokenObtainApi(APIView):
    """Exchange a username and password for an API token (a new one once it has expired)."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    class OutputSerializer(serializers.Serializer):
        token = serializers.CharField()
        expires = serializers.DateTimeField()

    @extend_schema(
        request=AuthTokenSerializer,
        responses={
            200: OutputSerializer,
            400: OpenApiResponse(description="Wrong username or password."),
            429: OpenApiResponse(description="Too many failed logins; try again later."),
        },
    )
    def post(self, request):
        serializer = AuthTokenSerializer(data=request.data, context={"request": request})
        if not serializer.is_valid():
            # django-axes marks the request when this username is (now) locked out.
            if getattr(request, "axes_locked_out", False):
                response = Response(
                    {"detail": get_lockout_message(), "code": "locked_out"},
                    status=status.HTTP_429_TOO_MANY_REQUESTS,
                )
                cool_off = get_cool_off(request)
                if cool_off:
                    response["Retry-After"] = str(int(cool_off.total_seconds()))
                return response
            return Response(serializer.errors, status=status.HTTP_400_BAD_REQUEST)
        user = serializer.validated_data["user"]
        token = accounts.token_issue(user=user)
        # As a session login does: clears this account's failure count and sets last_login.
        user_logged_in.send(sender=type(user), request=request, user=user)
        expires = token.created + settings.API_TOKEN_LIFETIME
        return Response(self.OutputSerializer({"token": token.key, "expires": expires}).data)


class TokenRevokeApi(APIView):
    """Revoke the caller's API token; the next call with it is refused."""

    @extend_schema(request=None, responses={204: None})
    def post(self, request):
        accounts.token_revoke(user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
