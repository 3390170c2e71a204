"""The two errors the engine raises at its boundary."""

from __future__ import annotations


class InvalidRequest(ValueError):
    """A request was refused at `add_request`: the message names the field and its accepted range.

    Raised before anything in the engine changes, so the other requests are not affected.
    """


class WeightUpdateError(ValueError):
    """A weight update was refused; the engine keeps its previous weights and version."""


class UnsupportedModel(ValueError):
    """The checkpoint uses a feature the built-in engine does not implement; the message names it.

    Such models still train (the trainer runs them through transformers); generate them with
    an engine that supports the feature.
    """
