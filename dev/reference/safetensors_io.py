"""
Minimal hand-written safetensors reader/writer (no safetensors package needed).

Layout: 8-byte little-endian u64 N, then N bytes of UTF-8 JSON header, then the data buffer.
Header: {"__metadata__": {str: str}, name: {"dtype": "F32"|"I32", "shape": [...],
"data_offsets": [begin, end]}, ...}, offsets relative to the start of the data buffer.
Tensors are stored contiguously, little-endian, in insertion order; the header is padded with
spaces so that the data buffer starts at an 8-byte aligned file offset.
"""
import json
import struct

import numpy as np

_DTYPES = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4"), "F64": np.dtype("<f8"), "I64": np.dtype("<i8")}
_NAMES = {v: k for k, v in _DTYPES.items()}


def _as_array(t):
    if hasattr(t, "detach"):  # torch tensor
        t = t.detach().cpu().numpy()
    return np.asarray(t)


def save(path, tensors, metadata=None):
    """tensors: dict name -> torch tensor or numpy array (float32/int32/float64/int64), written in dict order.
    metadata: dict str -> str. A "checksums" key (what xsa-train writes, dev/docs/data.md#safetensors: the checksums
    of the file it came from) is left out: it would not match this file, which is then read unchecked."""
    header = {}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"metadata must be str -> str, got {k!r}: {v!r}")
        header["__metadata__"] = {k: v for k, v in metadata.items() if k != "checksums"}
    blobs, off = [], 0
    for name, t in tensors.items():
        if name == "__metadata__":
            raise ValueError("tensor name __metadata__ is reserved")
        a = _as_array(t)
        dt = a.dtype.newbyteorder("<")
        if dt not in _NAMES:
            raise TypeError(f"{name}: unsupported dtype {a.dtype}")
        b = np.ascontiguousarray(a, dtype=dt).tobytes()
        header[name] = {"dtype": _NAMES[dt], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((-(8 + len(h))) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load(path):
    """Returns (tensors: dict name -> numpy array in file order, metadata: dict str -> str)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds file size {len(raw)}")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        dt = _DTYPES[info["dtype"]]
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * dt.itemsize or e > len(data):
            raise ValueError(f"{path}: tensor {name} has bad data_offsets {b},{e}")
        out[name] = np.frombuffer(data[b:e], dtype=dt).reshape(shape).copy()
    return out, meta
