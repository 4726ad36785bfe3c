"""Page sizes of the list endpoints: every list answers at most `MAX_PAGE_SIZE` rows a request.

``?limit=`` above the maximum is cut to it (DRF's LimitOffsetPagination behaviour), so a
client asking for everything gets one bounded page and the link to the next.
"""

from __future__ import annotations

from rest_framework.pagination import LimitOffsetPagination
from rest_framework.response import Response

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """Answer ``{count, next, previous, results}`` pages of at most MAX_PAGE_SIZE rows."""

    default_limit = DEFAULT_PAGE_SIZE
    max_limit = MAX_PAGE_SIZE


class HeaderLimitOffsetPagination(BoundedLimitOffsetPagination):
    """Answer a bounded page as a plain JSON list; count and links go in the headers.

    For endpoints that answered a bare list before pagination, so existing clients keep
    reading the body as they did (the GitHub API's ``Link`` header convention).
    """

    def get_paginated_response(self, data) -> Response:
        links = [
            f'<{url}>; rel="{rel}"'
            for url, rel in ((self.get_next_link(), "next"), (self.get_previous_link(), "prev"))
            if url
        ]
        headers = {"X-Total-Count": str(self.count), "X-Page-Limit": str(self.limit)}
        if links:
            headers["Link"] = ", ".join(links)
        return Response(data, headers=headers)


def paginate(*, request, view, rows, serializer_class=None, header: bool = True) -> Response:
    """Return one bounded page of rows (serialised with serializer_class when given)."""
    paginator = HeaderLimitOffsetPagination() if header else BoundedLimitOffsetPagination()
    page = paginator.paginate_queryset(rows, request, view=view)
    data = serializer_class(page, many=True).data if serializer_class is not None else page
    return paginator.get_paginated_response(data)
