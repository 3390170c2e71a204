"""The error categories the Tinker SDK reads from a failed future (``RequestFailedResponse``).

A ``user`` error is the caller's to fix (a malformed datum, an unknown loss, a bad path) and the
SDK raises it at once; a ``server`` error is ours. Messages name the field and the fix.
"""

from __future__ import annotations


class TinkerError(Exception):
    """A request the service refuses or could not complete; ``category`` is "user" or "server"."""

    def __init__(self, message: str, *, category: str = "user", status: int = 400) -> None:
        super().__init__(message)
        self.category = category
        self.status = status

    def body(self) -> dict:
        return {"error": str(self), "category": self.category}


def user_error(message: str) -> TinkerError:
    return TinkerError(message, category="user")
