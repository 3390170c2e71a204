"""The two errors the engine raises at its boundary."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request was refused at `add_request`: the message names the field and its accepted range.

    Raised before anything in the engine changes, so the other requests are not affected.
    """


class WeightUpdateError(ValueError):
    """A weight update was refused; the engine keeps its previous weights and version."""
