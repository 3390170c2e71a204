"""Plain values across the sandbox's boundary, as JSON: the arguments a test passes to the
model's function and what the function returns, and nothing else.

Both sides use this file: the worker in the sandbox encodes return values, the reward decodes
them. Only exact built-in types survive (None, bool, int, float, str, bytes, complex, list,
tuple, dict, set, frozenset); anything else — an object with an ``__eq__`` that says yes to
everything, a subclass of int — arrives as an :class:`Opaque` that equals nothing. So a test's
``==`` always runs on real data, on the reward's side, never on the model's objects.
"""

import json
import math

MAX_DEPTH = 40


class Opaque:
    """A value the boundary does not carry; equal only to itself."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<opaque {self.what}>"


def encode(x, depth: int = 0):
    t = type(x)
    if depth > MAX_DEPTH:
        return ["?", "too deep"]
    if x is None or t in (bool, int, str):
        return x
    if t is float:
        return x if math.isfinite(x) else ["float", repr(x)]
    if t in (list, tuple, set, frozenset):
        return [t.__name__, [encode(v, depth + 1) for v in x]]
    if t is dict:
        return ["dict", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]]
    if t is bytes:
        return ["bytes", x.hex()]
    if t is complex:
        return ["complex", [x.real, x.imag]]
    return ["?", str(getattr(t, "__name__", "object"))[:80]]


_CONTAINERS = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def decode(v):
    t = type(v)
    if v is None or t in (bool, int, str, float):
        return v
    if t is not list or len(v) != 2 or type(v[0]) is not str:
        return Opaque("malformed")
    tag, payload = v
    try:
        if tag in _CONTAINERS:
            return _CONTAINERS[tag](decode(item) for item in payload)
        if tag == "dict":
            return {decode(k): decode(val) for k, val in payload}
        if tag == "float":
            return float(payload)
        if tag == "bytes":
            return bytes.fromhex(payload)
        if tag == "complex":
            return complex(*payload)
    except (TypeError, ValueError):  # unhashable key, bad literal: not data we sent
        return Opaque(f"malformed {tag}")
    return Opaque(str(payload)[:80])


def dumps(x) -> str:
    return json.dumps(encode(x))


def loads(text: str):
    return decode(json.loads(text))
