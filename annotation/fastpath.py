"""The annotator's per-item calls, answered for API tokens without the browser's machinery.

An annotation tool's server cost is its per-item calls: `next`, `submit` (with the next item
in the same answer), `prefetch`, `heartbeat`, `release`. Made with an API token, such a call
needs none of the middleware that follows `SecurityMiddleware` and the static files (sessions,
the CSRF check, session login, messages, frame and content-security headers for pages, the
login-lockout page), and none of DRF's per-request work (content negotiation, parser and
authenticator objects, serializers): together they cost more CPU than the call's own SQL.

`TokenFastPathMiddleware` sits right after `SecurityMiddleware` (so HTTPS redirects, HSTS and
`nosniff` still apply) and WhiteNoise (static files only). For a POST carrying `Authorization:
Token ...` to a view built on `FastApiView`, it answers the call itself: the token is checked
by the same one-query `annotation.auth.TokenAuthentication`, the JSON body parsed with orjson,
the body checked against the view's `annotation.inputs` declaration and the view's `answer`
called; errors go through the same `annotation.apis.exception_handler` as DRF's, so the answers
are the same as on the full path, byte for byte apart from JSON whitespace. Any other request
(a browser with its session and CSRF token, another content type, another view) takes the full
path."""

import functools

import orjson
from django.http import HttpResponse
from django.urls import Resolver404, resolve
from rest_framework import status
from rest_framework.exceptions import ParseError
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from annotation.auth import TokenAuthentication
from annotation.inputs import InputSpec

_JSON_TYPES = ("", "application/json")


class FastApiView(APIView):
    """An APIView whose POST is `answer(request, data, **url_kwargs) -> (status, body)`.

    `input_spec` declares the body (`annotation.inputs`); `data` is the checked body, with
    defaults filled in. `request.user` is the authenticated caller on both paths.
    """

    input_spec: InputSpec = InputSpec()

    def answer(self, request, data: dict, **kwargs) -> tuple[int, dict | None]:
        raise NotImplementedError

    def post(self, request, **kwargs):
        code, body = self.answer(request, self.input_spec.validate(request.data), **kwargs)
        return Response(body, status=code)

    @classmethod
    def as_view(cls, **initkwargs):
        view = super().as_view(**initkwargs)
        view.token_answer = functools.partial(_token_answer, cls)
        return view


def _token_answer(view_class: type[FastApiView], request, **kwargs) -> HttpResponse | None:
    """Answer a token call to a FastApiView; None hands it to the full path."""
    header = request.META.get("HTTP_AUTHORIZATION", "").split()
    content_type = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    if len(header) != 2 or content_type not in _JSON_TYPES:
        return None
    view = view_class()
    view.request, view.args, view.kwargs, view.format_kwarg = request, (), kwargs, None
    try:
        user, _ = TokenAuthentication().authenticate_credentials(header[1])
        request.user = user
        raw = request.body
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError as error:
            raise ParseError(f"JSON parse error - {error}") from error
        code, body = view.answer(request, view.input_spec.validate(data), **kwargs)
    except Exception as exc:
        answered = api_settings.EXCEPTION_HANDLER(exc, {"view": view, "request": request})
        if answered is None:
            raise
        response = json_response(answered.data, answered.status_code)
        for name, value in answered.items():
            if name.lower() != "content-type":
                response[name] = value
        if answered.status_code == status.HTTP_401_UNAUTHORIZED:
            response["WWW-Authenticate"] = TokenAuthentication().authenticate_header(request)
        return response
    return json_response(body, code)


def json_response(body, code: int) -> HttpResponse:
    if body is None:
        return HttpResponse(status=code)
    return HttpResponse(orjson.dumps(body), status=code, content_type="application/json")


class TokenFastPathMiddleware:
    """Answer token-authenticated POSTs to FastApiViews without the rest of the chain."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method == "POST" and request.META.get("HTTP_AUTHORIZATION", "").startswith(
            "Token "
        ):
            try:
                match = resolve(request.path_info)
            except Resolver404:
                match = None
            answer = getattr(match.func, "token_answer", None) if match else None
            if answer is not None:
                request.resolver_match = match
                response = answer(request, **match.kwargs)
                if response is not None:
                    return response
        return self.get_response(request)
