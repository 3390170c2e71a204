"""Request and response encodings of the Tinker API, from the schema the ``tinker`` SDK ships.

The SDK (0.38) sends ``forward_backward`` as protobuf (``tinker.proto.tinker_public_pb2``) and
asks for ``ForwardBackwardOutput`` and ``SampleResponse`` as protobuf; everything else is JSON.
Older SDKs send ``forward_backward`` as JSON, which is read too. Whatever arrives becomes plain
numpy here, checked field by field, so the service never sees the SDK's own classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tokenflow.tinker.errors import user_error

PROTO = "application/x-protobuf"
MAX_TOKENS_PER_DATUM = 1 << 20
"""A datum longer than this is refused before anything is allocated (the model's own context
length is checked later, by the model)."""


@dataclass
class Datum:
    """One sequence: the model input and the loss inputs, dense, one row per input position."""

    tokens: np.ndarray  # int64 [T]
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class ForwardBackwardCall:
    model_id: str
    seq_id: int | None
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    data: list[Datum]
    forward_only: bool = False

    def check(self) -> None:
        """A user error naming the first datum field that cannot be what it claims (run inside the
        call's future, so the SDK raises it as a user error at once instead of retrying a 400)."""
        for i, d in enumerate(self.data):
            _checked_datum(d, i)


def _pb():
    from tinker.proto import tinker_public_pb2

    return tinker_public_pb2


# -- requests --------------------------------------------------------------------------------


def decode_forward_backward(body: bytes, content_type: str, content_encoding: str = "",
                            *, forward_only: bool | None = None) -> ForwardBackwardCall:
    """The call a ``/forward_backward`` (or ``/forward``) body carries, in either encoding."""
    if "zstd" in content_encoding.lower():
        import zstandard

        try:
            body = zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 31)
        except zstandard.ZstdError as e:
            raise user_error(f"Content-Encoding zstd but the body does not decompress: {e}") from None
    if PROTO in content_type:
        return _from_proto(body, forward_only)
    import json

    try:
        obj = json.loads(body)
    except ValueError as e:
        raise user_error(f"the body is neither protobuf (Content-Type {PROTO}) nor JSON: {e}") from None
    return _from_json(obj, forward_only)


def _from_proto(body: bytes, forward_only: bool | None) -> ForwardBackwardCall:
    pb = _pb()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # protobuf's DecodeError
        raise user_error(f"the protobuf ForwardBackwardRequest does not parse: {e}") from None
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():  # preferred where set: it also carries strings
        config[k] = v.text if v.WhichOneof("value") == "text" else float(v.number)
    data = []
    for i, d in enumerate(msg.data):
        parts = []
        for j, chunk in enumerate(d.model_input):
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise user_error(f"data[{i}].model_input.chunks[{j}] is a {kind} chunk; this service "
                                 "trains text models and takes encoded_text chunks only")
            parts.append(np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).astype(np.int64))
        tokens = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        inputs = {name: _tensor_from_proto(t, f"data[{i}].loss_fn_inputs[{name!r}]")
                  for name, t in d.loss_fn_inputs.items()}
        data.append(Datum(tokens, inputs))
    return ForwardBackwardCall(msg.model_id, msg.seq_id or None, msg.loss_fn, config, data,
                               msg.forward_only if forward_only is None else forward_only)


def _tensor_from_proto(t, where: str) -> np.ndarray:
    pb = _pb()
    dtypes = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if t.dtype not in dtypes:
        raise user_error(f"{where}: dtype {t.dtype} is not float32 or int64")
    dtype = dtypes[t.dtype]
    shape = list(t.shape)
    if t.HasField("sparse_csr"):
        values = _frombuffer(t.sparse_csr.values, dtype, where)
        crow = _frombuffer(t.sparse_csr.crow_indices, np.int64, where)
        col = _frombuffer(t.sparse_csr.col_indices, np.int64, where)
        return _dense_from_csr(values, crow.tolist(), col.tolist(), shape, where)
    arr = _frombuffer(t.dense, dtype, where)
    return _reshaped(arr, shape, where)


def _frombuffer(raw: bytes, dtype, where: str) -> np.ndarray:
    if len(raw) % np.dtype(dtype).itemsize:
        raise user_error(f"{where}: {len(raw)} bytes is not a whole number of {np.dtype(dtype).name} values")
    return np.frombuffer(raw, dtype=dtype)


def _reshaped(arr: np.ndarray, shape: list[int] | None, where: str) -> np.ndarray:
    if not shape:
        return arr.reshape(-1)
    if any(s < 0 for s in shape) or int(np.prod(shape)) != arr.size:
        raise user_error(f"{where}: shape {shape} does not hold its {arr.size} values")
    return arr.reshape(shape)


def _dense_from_csr(values, crow: list[int], col: list[int], shape: list[int] | None, where: str) -> np.ndarray:
    if not shape or len(shape) > 2 or any(s < 0 for s in shape):
        raise user_error(f"{where}: a sparse tensor needs a 1-D or 2-D shape, got {shape}")
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    if rows * cols > MAX_TOKENS_PER_DATUM * 64:
        raise user_error(f"{where}: dense shape {shape} is too large")
    if len(crow) != rows + 1 or len(col) != len(values) or crow[0] != 0 or crow[-1] != len(values) \
            or any(b < a for a, b in zip(crow, crow[1:])) or any(c < 0 or c >= cols for c in col):
        raise user_error(f"{where}: sparse_crow_indices/sparse_col_indices do not describe a {shape} tensor")
    dense = np.zeros((rows, cols), dtype=np.asarray(values).dtype)
    for r in range(rows):
        dense[r, col[crow[r]:crow[r + 1]]] = values[crow[r]:crow[r + 1]]
    return dense.reshape(shape)


def _from_json(obj, forward_only: bool | None) -> ForwardBackwardCall:
    if not isinstance(obj, dict):
        raise user_error("the body must be a JSON object")
    fb = obj.get("forward_backward_input") or obj.get("forward_input")
    if not isinstance(fb, dict):
        raise user_error("the body has no forward_backward_input object")
    raw = fb.get("data")
    if not isinstance(raw, list):
        raise user_error("forward_backward_input.data must be a list of datums")
    data = [_datum_from_json(d, i) for i, d in enumerate(raw)]
    config = fb.get("loss_fn_config") or {}
    if not isinstance(config, dict) or not all(isinstance(v, (int, float, str)) for v in config.values()):
        raise user_error("forward_backward_input.loss_fn_config must map names to numbers or strings")
    seq = obj.get("seq_id")
    if seq is not None and not isinstance(seq, int):
        raise user_error("seq_id must be an integer")
    only = bool(obj.get("forward_only", False)) if forward_only is None else forward_only
    return ForwardBackwardCall(str(obj.get("model_id", "")), seq, str(fb.get("loss_fn", "")),
                               dict(config), data, only)


def _datum_from_json(d, i: int) -> Datum:
    if not isinstance(d, dict) or not isinstance(d.get("model_input"), dict):
        raise user_error(f"data[{i}] must be an object with model_input and loss_fn_inputs")
    parts = []
    for j, chunk in enumerate(d["model_input"].get("chunks") or []):
        if not isinstance(chunk, dict) or chunk.get("type", "encoded_text") != "encoded_text":
            raise user_error(f"data[{i}].model_input.chunks[{j}]: only encoded_text chunks are supported")
        parts.append(_int_array(chunk.get("tokens"), f"data[{i}].model_input.chunks[{j}].tokens"))
    tokens = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    inputs = {}
    for name, t in (d.get("loss_fn_inputs") or {}).items():
        where = f"data[{i}].loss_fn_inputs[{name!r}]"
        if not isinstance(t, dict) or not isinstance(t.get("data"), list):
            raise user_error(f"{where} must be a TensorData object with data, dtype, shape")
        dtype = {"float32": np.float32, "int64": np.int64}.get(t.get("dtype"))
        if dtype is None:
            raise user_error(f"{where}: dtype {t.get('dtype')!r} is not float32 or int64")
        try:
            values = np.asarray(t["data"], dtype=dtype)
        except (TypeError, ValueError, OverflowError):
            raise user_error(f"{where}: data is not a flat list of numbers") from None
        if t.get("sparse_crow_indices") is not None:
            inputs[name] = _dense_from_csr(values, list(t["sparse_crow_indices"]),
                                           list(t.get("sparse_col_indices") or []), t.get("shape"), where)
        else:
            inputs[name] = _reshaped(values.reshape(-1), t.get("shape"), where)
    return Datum(tokens, inputs)


def _int_array(values, where: str) -> np.ndarray:
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise user_error(f"{where} must be a list of integer token ids")
    return np.asarray(values, dtype=np.int64)


def _checked_datum(d: Datum, i: int) -> Datum:
    if d.tokens.size == 0:
        raise user_error(f"data[{i}].model_input is empty")
    if d.tokens.size > MAX_TOKENS_PER_DATUM:
        raise user_error(f"data[{i}].model_input has {d.tokens.size} tokens, more than {MAX_TOKENS_PER_DATUM}")
    for name, arr in d.inputs.items():
        if arr.ndim == 0 or arr.shape[0] != d.tokens.size:
            raise user_error(f"data[{i}].loss_fn_inputs[{name!r}] has shape {list(arr.shape)} but model_input "
                             f"has {d.tokens.size} tokens: each loss input needs one row per input position")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise user_error(f"data[{i}].loss_fn_inputs[{name!r}] holds NaN or infinity")
    return d


# -- responses -------------------------------------------------------------------------------


def forward_backward_output_proto(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> bytes:
    """``ForwardBackwardOutput`` as one batched ``ArrayRecord``: per field, the datums' values
    back to back with byte offsets (how ``tinker.proto.response_conv`` reads it)."""
    pb = _pb()
    msg = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    for k, v in metrics.items():
        msg.metrics[k] = float(v)
    record = msg.loss_fn_outputs.add()
    record.num_datums = len(outputs)
    names = list(outputs[0]) if outputs else []
    for name in names:
        arrays = [np.ascontiguousarray(o[name]) for o in outputs]
        is_int = arrays[0].dtype.kind in "iu"
        dtype = np.int64 if is_int else np.float32
        arrays = [a.astype(dtype, copy=False) for a in arrays]
        bt = record.fields[name]
        bt.dtype = pb.DTYPE_INT64 if is_int else pb.DTYPE_FLOAT32
        bt.trailing_shape.extend(list(arrays[0].shape[1:]))
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        bt.offsets = offsets.tobytes()
        bt.data = b"".join(a.tobytes() for a in arrays)
    return msg.SerializeToString()


def forward_backward_output_json(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float]) -> dict:
    def td(a: np.ndarray) -> dict:
        return {"data": a.reshape(-1).tolist(), "dtype": "int64" if a.dtype.kind in "iu" else "float32",
                "shape": list(a.shape)}

    return {"loss_fn_output_type": "ArrayRecord", "metrics": metrics,
            "loss_fn_outputs": [{k: td(v) for k, v in o.items()} for o in outputs]}


@dataclass
class Sequence:
    tokens: np.ndarray
    logprobs: np.ndarray
    stop_reason: str  # "stop" | "length"
    top: tuple[np.ndarray, np.ndarray] | None = None  # [n, k] ids, [n, k] log-probs


@dataclass
class Sampled:
    sequences: list[Sequence]
    prompt_logprobs: np.ndarray | None = None  # [P], NaN at position 0
    prompt_top: tuple[np.ndarray, np.ndarray] | None = None
    versions: list[np.ndarray] | None = None
    """Per sequence, the policy version of each token (the snapshot's); not on the wire."""


def sample_response_proto(s: Sampled) -> bytes:
    pb = _pb()
    msg = pb.SampleResponse()
    for seq in s.sequences:
        m = msg.sequences.add()
        m.stop_reason = pb.STOP_REASON_STOP if seq.stop_reason == "stop" else pb.STOP_REASON_LENGTH
        m.tokens = np.asarray(seq.tokens, np.int32).tobytes()
        m.logprobs = np.asarray(seq.logprobs, np.float32).tobytes()
        if seq.top is not None:
            _write_topk(m.topk_sampled_logprobs, *seq.top)
    if s.prompt_logprobs is not None:
        msg.prompt_logprobs = np.asarray(s.prompt_logprobs, np.float32).tobytes()
    if s.prompt_top is not None:
        _write_topk(msg.topk_prompt_logprobs, *s.prompt_top)
    return msg.SerializeToString()


def _write_topk(m, ids: np.ndarray, logprobs: np.ndarray) -> None:
    m.length, m.k = int(ids.shape[0]), int(ids.shape[1]) if ids.ndim == 2 else 0
    m.token_ids = np.asarray(ids, np.int32).tobytes()
    m.logprobs = np.asarray(logprobs, np.float32).tobytes()


def sample_response_json(s: Sampled) -> dict:
    def nan_to_none(a):
        return [None if not np.isfinite(x) else float(x) for x in a]

    out = {"type": "sample", "sequences": [
        {"stop_reason": q.stop_reason, "tokens": q.tokens.tolist(), "logprobs": q.logprobs.tolist()}
        for q in s.sequences]}
    if s.prompt_logprobs is not None:
        out["prompt_logprobs"] = nan_to_none(s.prompt_logprobs)
    return out
