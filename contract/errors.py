"""The one client error: what is wrong with a request, in words the client can act on, and the HTTP status that
says so. Raised where the request is found wrong (decoding an image or a text, parsing a form, a JSON body or the
protocol's tensors, a task's own checks) and turned into `{"error": ...}` in one place, serve/http/router.py."""

from __future__ import annotations


class ClientError(ValueError):
    def __init__(self, message: str, status: int = 400, retry_after_s: int | None = None) -> None:
        """`retry_after_s`: when the request may succeed if sent again (a 503 or 429's Retry-After header)."""
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s
