"""The Open Inference Protocol's binary tensor data extension: tensors as raw bytes.

A V2 request may carry tensor data after its JSON object instead of inside it.
The ``Inference-Header-Content-Length`` header gives the JSON object's length;
each input sent so has ``"parameters": {"binary_data_size": n}`` and no
``"data"``, and the inputs' bytes follow the JSON object in the inputs' order.
An element is little-endian in its type's native size, row-major, without
padding; a BOOL is one byte, 0 or 1; a BYTES element is its length as a 4-byte
little-endian unsigned integer, then that many bytes. A response does the same
for the outputs the client asked to get as binary (``"binary_data": true`` on a
requested output, or the request parameter ``"binary_data_output": true``) and
is then ``application/octet-stream``, its JSON length in the same header.

Pure functions on bytes; malformed data raises ``ValueError`` with a message
saying what is wrong, which ``mark.serve.codec`` turns into a 400.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

HEADER_LENGTH = "Inference-Header-Content-Length"
OCTET_STREAM = "application/octet-stream"

_DTYPES: dict[str, np.dtype[Any]] = {
    name: np.dtype(code)
    for name, code in {
        "BOOL": "u1",
        "UINT8": "u1",
        "UINT16": "<u2",
        "UINT32": "<u4",
        "UINT64": "<u8",
        "INT8": "i1",
        "INT16": "<i2",
        "INT32": "<i4",
        "INT64": "<i8",
        "FP16": "<f2",
        "FP32": "<f4",
        "FP64": "<f8",
    }.items()
}
_LENGTH = struct.Struct("<I")


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON object of a request body and the binary tensor data after it.

    ``header_length`` is the ``Inference-Header-Content-Length`` header, if sent;
    without it the whole body is the JSON object.
    """
    if header_length is None:
        return body, b""
    text = header_length.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise ValueError(f"{HEADER_LENGTH} must be a byte count, got {header_length!r}")
    n = int(text)
    if n > len(body):
        raise ValueError(f"{HEADER_LENGTH} is {n}, but the body has only {len(body)} bytes")
    return body[:n], body[n:]


def decode(datatype: str, raw: bytes, count: int) -> np.ndarray[Any, Any]:
    """``count`` elements of ``datatype`` read from ``raw``, which they must fill exactly.

    A flat array in native byte order; BYTES elements come back as ``bytes`` in an
    object array.
    """
    if datatype == "BYTES":
        return _decode_bytes(raw, count)
    dtype = _DTYPES.get(datatype)
    if dtype is None:
        raise ValueError(f"unknown datatype {datatype!r}")
    need = count * dtype.itemsize
    if len(raw) != need:
        raise ValueError(
            f"{len(raw)} bytes of binary data; {count} {datatype} elements take {need}"
        )
    arr = np.frombuffer(raw, dtype=dtype)
    if datatype == "BOOL":
        if arr.size and int(arr.max()) > 1:
            raise ValueError("a BOOL element must be the byte 0 or 1")
        return arr.astype(np.bool_)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def _decode_bytes(raw: bytes, count: int) -> np.ndarray[Any, Any]:
    if count * _LENGTH.size > len(raw):  # before allocating: each element takes >= 4 bytes
        raise ValueError(f"{len(raw)} bytes of binary data cannot hold {count} BYTES elements")
    out = np.empty(count, dtype=object)
    pos = 0
    for i in range(count):
        if pos + _LENGTH.size > len(raw):
            raise ValueError(f"the BYTES data ends before element {i} of {count}")
        (n,) = _LENGTH.unpack_from(raw, pos)
        pos += _LENGTH.size
        if pos + n > len(raw):
            raise ValueError(f"BYTES element {i} claims {n} bytes; {len(raw) - pos} are left")
        out[i] = raw[pos : pos + n]
        pos += n
    if pos != len(raw):
        raise ValueError(f"{len(raw) - pos} bytes are left after {count} BYTES elements")
    return out


def encode(arr: np.ndarray[Any, Any], datatype: str) -> bytes:
    """``arr`` as the binary data of a ``datatype`` tensor (row-major, little-endian).

    BYTES elements may be ``bytes`` or anything else, written as its UTF-8 text.
    """
    if datatype == "BYTES":
        parts: list[bytes] = []
        for x in np.asarray(arr, dtype=object).ravel():
            b = bytes(x) if isinstance(x, bytes | bytearray) else str(x).encode()
            parts += (_LENGTH.pack(len(b)), b)
        return b"".join(parts)
    dtype = _DTYPES.get(datatype)
    if dtype is None:
        raise ValueError(f"unknown datatype {datatype!r}")
    if datatype == "BOOL":
        arr = np.asarray(arr, dtype=np.bool_)
    return np.ascontiguousarray(arr, dtype=dtype).tobytes()
