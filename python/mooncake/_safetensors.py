"""`save_tensor_to_safetensor` / `load_tensor_from_safetensor`, on a small codec of the
safetensors file format (so the `safetensors` package is not needed):

    [u64 LE: header length N][N bytes: JSON header, space-padded to a multiple of 8][data]

The header maps each tensor name to `{"dtype": "F32", "shape": [...], "data_offsets": [b, e]}`
(offsets into the data section); an optional `"__metadata__"` entry holds strings. Files written
here have one tensor, named by the store key, as upstream writes them.
"""

import json
import logging
import os
import struct

from mooncake._tensor import _INVALID, _contiguous_cpu, _memory_of, _torch_mod
from mooncake.error_codes import ErrorCode

log = logging.getLogger("mooncake.store")

_FILE_NOT_FOUND = int(ErrorCode.FILE_NOT_FOUND)
_HEADER_LIMIT = 100 << 20
# torch dtype name -> safetensors dtype tag
_TAGS = {
    "float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16",
    "int8": "I8", "uint8": "U8", "int16": "I16", "uint16": "U16", "int32": "I32",
    "uint32": "U32", "int64": "I64", "uint64": "U64", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


def encode(name, tensor):
    """The bytes of a safetensors file holding `tensor` under `name`."""
    t = _contiguous_cpu(tensor)
    tag = _TAGS.get(str(t.dtype).removeprefix("torch."))
    if tag is None:
        raise ValueError(f"dtype {t.dtype} has no safetensors tag")
    nbytes = t.numel() * t.element_size()
    header = {name: {"dtype": tag, "shape": list(t.shape), "data_offsets": [0, nbytes]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    mem = _memory_of(t)
    data = b"" if mem is None else bytes(mem)
    return struct.pack("<Q", len(text)) + text + data


def decode(raw):
    """{name: tensor} of a safetensors file's bytes; ValueError when malformed."""
    torch = _torch_mod()
    if len(raw) < 8:
        raise ValueError("file shorter than its header length")
    (n,) = struct.unpack_from("<Q", raw, 0)
    if n > _HEADER_LIMIT or 8 + n > len(raw):
        raise ValueError(f"header length {n} does not fit a file of {len(raw)} bytes")
    header = json.loads(raw[8 : 8 + n])
    data = memoryview(raw)[8 + n :]
    by_tag = {v: k for k, v in _TAGS.items()}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = getattr(torch, by_tag.get(info.get("dtype"), ""), None)
        if dtype is None:
            raise ValueError(f"tensor {name!r}: unknown dtype {info.get('dtype')!r}")
        b, e = info["data_offsets"]
        shape = [int(d) for d in info["shape"]]
        if not 0 <= b <= e <= len(data):
            raise ValueError(f"tensor {name!r}: data offsets {b}..{e} outside the file")
        count = 1
        for d in shape:
            count *= d
        if count * torch.empty((), dtype=dtype).element_size() != e - b:
            raise ValueError(f"tensor {name!r}: {e - b} bytes for shape {shape}")
        if e == b:
            out[name] = torch.empty(shape, dtype=dtype)
        else:
            flat = torch.frombuffer(bytearray(data[b:e]), dtype=torch.uint8)
            out[name] = flat.view(dtype).reshape(shape)
    return out


class SafetensorMethods:
    """The safetensors export and import of `MooncakeDistributedStore`."""

    def save_tensor_to_safetensor(self, key, file_name=None):
        """Writes the tensor stored under `key` to `file_name` (default: the key); 0, -1100
        (FILE_NOT_FOUND) when `key` holds no tensor, -600 when not set up or on a write
        failure."""
        if not self.get_hostname():
            log.error("save_tensor_to_safetensor: client is not initialized")
            return _INVALID
        tensor = self.get_tensor(key)
        if tensor is None:
            log.error("save_tensor_to_safetensor: failed to fetch tensor for key %s", key)
            return _FILE_NOT_FOUND
        path = key if file_name is None else os.fspath(file_name)
        try:
            raw = encode(key, tensor)
            with open(path, "wb") as f:
                f.write(raw)
        except (OSError, ValueError) as e:
            log.error("save_tensor_to_safetensor: failed to save %s: %s", path, e)
            return _INVALID
        return 0

    def load_tensor_from_safetensor(self, key=None, file_name=None):
        """Reads a tensor from `file_name` (the entry named `key`, else the first), stores it
        with `put_tensor(key or file_name)` and returns it; None on failure."""
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor() missing argument 'file_name'")
        try:
            with open(file_name, "rb") as f:
                tensors = decode(f.read())
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.error("load_tensor_from_safetensor: failed to load %s: %s", file_name, e)
            return None
        if not tensors:
            log.error("load_tensor_from_safetensor: %s holds no tensor", file_name)
            return None
        store_key = file_name if key is None else key
        if key in tensors:
            tensor = tensors[key]
        else:
            first = next(iter(tensors))
            if key is not None:
                log.warning("load_tensor_from_safetensor: %r not in %s, using %r",
                            key, file_name, first)
            tensor = tensors[first]
        rc = self.put_tensor(store_key, tensor)
        if rc != 0:
            log.error("load_tensor_from_safetensor: put_tensor(%s) failed: %d", store_key, rc)
            return None
        return tensor
