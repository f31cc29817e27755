"""Typed errors raised by the Airlock SDK.

Every non-2xx answer of the API (and of a worker's data plane) has the body
``{"error": {"code": "...", "message": "..."}}``; :func:`error_from_response`
turns it into the matching :class:`AirlockError` subclass.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Type

__all__ = [
    "AirlockError",
    "InvalidRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "Gone",
    "QuotaExceeded",
    "RateLimited",
    "Unavailable",
    "OperationFailed",
    "error_from_response",
]


class AirlockError(Exception):
    """Base class of every error the SDK raises.

    ``status`` is the HTTP status (0 when no answer was received), ``code``
    the API's error code (``not_found``, ``conflict``, …) and ``message`` the
    server's message, which says what to do next.
    """

    def __init__(self, message: str, *, status: int = 0, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def __str__(self) -> str:
        parts = []
        if self.status:
            parts.append(str(self.status))
        if self.code:
            parts.append(self.code)
        prefix = " ".join(parts)
        return f"{prefix}: {self.message}" if prefix else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status!r}, code={self.code!r}, message={self.message!r})"


class InvalidRequest(AirlockError):
    """400 or 422: a malformed or invalid request (``bad_request``, ``invalid``, ``unprocessable``)."""


class Unauthorized(AirlockError):
    """401: a missing, invalid, revoked or expired API key (or data-plane token)."""


class Forbidden(AirlockError):
    """403: the key may not do this, or the org lacks a feature gate (e.g. ``snapshots``)."""


class NotFound(AirlockError):
    """404: no such resource in your org."""


class Conflict(AirlockError):
    """409: the sandbox's state does not allow the request, or another operation is in progress."""


class Gone(AirlockError):
    """410: the command already ran and its record was dropped; it is not run again."""


class QuotaExceeded(AirlockError):
    """429 ``quota_exceeded``: the org is at one of its quotas (the message names it)."""


class RateLimited(AirlockError):
    """429 ``rate_limited``: too many requests; retry after ``retry_after`` seconds."""

    def __init__(self, message: str, *, status: int = 429, code: str = "rate_limited",
                 retry_after: Optional[float] = None) -> None:
        super().__init__(message, status=status, code=code)
        self.retry_after = retry_after


class Unavailable(AirlockError):
    """503 (or no answer at all): a dependency is down, e.g. the sandbox's worker."""


class OperationFailed(AirlockError):
    """An operation ended ``failed`` or ``cancelled``; ``operation`` holds it, ``reason`` says why."""

    def __init__(self, operation: Any) -> None:
        reason = getattr(operation, "reason", "") or "no reason given"
        super().__init__(
            f"operation {operation.id} ({operation.kind}) {operation.state}: {reason}",
            status=0,
            code=str(operation.state),
        )
        self.operation = operation
        self.reason = getattr(operation, "reason", "")


_BY_CODE: Dict[str, Type[AirlockError]] = {
    "bad_request": InvalidRequest,
    "invalid": InvalidRequest,
    "unprocessable": InvalidRequest,
    "too_large": InvalidRequest,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "gone": Gone,
    "quota_exceeded": QuotaExceeded,
    "rate_limited": RateLimited,
    "unavailable": Unavailable,
}

_BY_STATUS: Dict[int, Type[AirlockError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    413: InvalidRequest,
    422: InvalidRequest,
    429: RateLimited,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    value = headers.get("retry-after") or headers.get("Retry-After")
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def error_from_response(status: int, body: bytes, headers: Mapping[str, str]) -> AirlockError:
    """Build the typed error for a non-2xx answer (status, raw body, headers)."""
    code = ""
    message = ""
    try:
        doc = json.loads(body.decode("utf-8", "replace")) if body else None
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict):
            code = str(err.get("code") or "")
            message = str(err.get("message") or "")
        elif "message" in doc:  # the ports proxy's {"sandboxId","message","code"}
            message = str(doc.get("message") or "")
    if not message:
        message = body.decode("utf-8", "replace").strip()[:2000] or f"HTTP {status}"
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if cls is None:
        cls = Unavailable if status >= 500 and status != 500 else AirlockError
    if cls is RateLimited:
        return RateLimited(message, status=status, code=code or "rate_limited", retry_after=_retry_after(headers))
    return cls(message, status=status, code=code)
