"""Open a GGUF file (v2/v3): walk its header once, validating and decoding it, then map its tensors.

The header is walked with every count and length checked against the bytes that remain (an array of N items
needs at least N * item_size bytes), which bounds all work and memory by the file's size, and every problem
becomes a ModelLoadError that names the file and the problem. The same walk decodes the metadata: arrays of
numbers with one numpy call each, strings with one slice each. (gguf.GGUFReader keeps a numpy view per array
item: 20 s for a 151k-token vocabulary, where this walk takes well under one.) Tensors are read-only numpy
views over an mmap of the file.
"""

from __future__ import annotations

from collections.abc import Callable
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from inferd._gguf import STRINGS_NO_LENGTH, STRINGS_NOT_UTF8, STRINGS_SHORT, read_strings

from .layers import check_tensors
from .model_config import ModelConfig
from .errors import ModelLoadError
from .ggml_types import GGML_TYPES
from .quant import LOADABLE_TYPES
from .tensor import Tensor

_T = TypeVar("_T")

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # v1 used 32-bit counts and is long gone
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ARRAY_ITEMS = 1 << 24  # far above any vocabulary; GGUFReader keeps a numpy view per item
MAX_TENSORS = 1 << 20
DEFAULT_ALIGNMENT = 32
TENSORS_PER_LAYER = 9  # norms, q/k/v/o, gate/up/down
# GGUF value types -> byte size of fixed-size scalars (8 = string, 9 = array are variable)
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_NUMPY_TYPES = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}


@dataclass
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is the row length (cols)
    type: str
    offset: int  # absolute, in the file
    nbytes: int


@dataclass
class GGUFHeader:
    version: int
    alignment: int
    data_offset: int
    tensors: list[TensorInfo]
    metadata: dict[str, Any]  # decoded values: int, float, bool, str, or lists of them (GGUF.* keys excluded)


@dataclass
class GGUFModel:
    path: str
    version: int
    metadata: dict[str, Any]  # decoded values: int, float, bool, str, or lists of them
    config: ModelConfig
    tensors: dict[str, Tensor]  # GGUF names, types as stored in the file (quant.py converts them)


def load_gguf(path: str | os.PathLike[str]) -> GGUFModel:
    """Validate and read a GGUF model; the result has exactly the tensors its config needs."""
    path = os.fspath(path)
    header = validate_gguf(path)
    metadata = header.metadata
    _check_tokenizer_metadata(path, metadata)
    if int(metadata.get("split.count", 1)) > 1:
        raise ModelLoadError(path, "split GGUF files are not supported; merge them with llama-gguf-split --merge")

    infos = {t.name: t for t in header.tensors}
    try:
        with open(path, "rb") as f:
            file_map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise ModelLoadError(path, f"cannot map file: {e.strerror or e}") from e
    by_name = {name: _tensor_data(file_map, info) for name, info in infos.items()}
    rope_freqs = None
    if "rope_freqs.weight" in by_name:
        data = by_name.pop("rope_freqs.weight")
        if infos["rope_freqs.weight"].type != "F32":
            raise ModelLoadError(path, f"rope_freqs.weight has type {infos['rope_freqs.weight'].type}, expected F32")
        rope_freqs = np.asarray(data, dtype=np.float64)
    try:
        config = ModelConfig.from_gguf(metadata, by_name.keys(), rope_freqs)
    except (ValueError, TypeError, KeyError, ArithmeticError) as e:  # e.g. int() of a float metadata value
        raise ModelLoadError(path, str(e) or type(e).__name__) from e
    # Multi-token prediction layers follow the trunk's (Qwen3.5's nextn_predict_layers): not run, so not loaded
    mtp = [
        n
        for n in by_name
        if n.startswith("blk.") and n.split(".")[1].isdigit() and int(n.split(".")[1]) >= config.n_layers
    ]
    if mtp and int(metadata.get(f"{config.arch}.nextn_predict_layers", 0) or 0):
        for name in mtp:
            del by_name[name]
    # A corrupt block_count must be refused before anything loops over the layers (2**31 layers would
    # take minutes and gigabytes just to list the tensors they need): each layer has at least 9 tensors.
    if config.n_layers * TENSORS_PER_LAYER > len(by_name):
        raise ModelLoadError(
            path,
            f"{config.arch}.block_count {config.n_layers} needs at least "
            f"{config.n_layers * TENSORS_PER_LAYER} tensors; the file has {len(by_name)}",
        )

    for info in infos.values():
        if len(info.dims) > 3 and info.name in by_name:
            raise ModelLoadError(
                path, f"tensor {info.name} has {len(info.dims)} dimensions; only 1-D to 3-D weights are supported"
            )
    try:
        check_tensors(config, {n: _rows_cols(infos[n].dims) for n in by_name})
    except ValueError as e:
        raise ModelLoadError(path, str(e)) from e
    for name in by_name:
        if infos[name].type not in LOADABLE_TYPES:
            raise ModelLoadError(
                path,
                f"tensor {name} has type {infos[name].type}, which is not supported "
                f"(supported: {', '.join(LOADABLE_TYPES)})",
            )
    tensors = {name: _to_tensor(name, data, infos[name]) for name, data in by_name.items()}
    return GGUFModel(path, header.version, metadata, config, tensors)


def _check_tokenizer_metadata(path: str, metadata: dict[str, Any]) -> None:
    """The vocabulary's types, before a tokenizer library sees them (and fails with a bare Exception). That a
    byte-level BPE merge "a b" has a, b and the joined "ab" in the vocabulary is checked where the merges are split
    (Tokenizer.from_gguf), once: 150k merges take a while in Python. A GGUF array has one item type, so its first
    item's is every item's."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        return
    if not isinstance(tokens, list) or (tokens and not isinstance(tokens[0], str)):
        raise ModelLoadError(path, "tokenizer.ggml.tokens is not a list of strings")
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None or metadata.get("tokenizer.ggml.model") != "gpt2":
        return
    if not isinstance(merges, list) or (merges and not isinstance(merges[0], str)):
        raise ModelLoadError(path, "tokenizer.ggml.merges is not a list of strings")


def _rows_cols(dims: tuple[int, ...]) -> tuple[int, ...]:
    """(rows, cols) of a 1-D or 2-D tensor; (n, rows, cols) of a 3-D one (the experts of a layer, one after another)."""
    if len(dims) == 1:
        return (1, dims[0])
    return tuple(reversed(dims))


def _tensor_data(file_map: mmap.mmap, info: TensorInfo) -> np.ndarray:
    """The tensor's bytes as a read-only array over the map (float32 for F32, uint16 for F16/BF16)."""
    dtype = np.float32 if info.type == "F32" else np.uint16 if info.type in ("F16", "BF16") else np.uint8
    return np.frombuffer(file_map, dtype=dtype, count=info.nbytes // np.dtype(dtype).itemsize, offset=info.offset)


def _to_tensor(name: str, data: np.ndarray, info: TensorInfo) -> Tensor:
    """A 3-D tensor (n, rows, cols) is held as its n matrices stacked by rows, (n * rows, cols): the engine takes
    each expert as a view of its rows (inferd.engine.weights)."""
    *outer, cols = _rows_cols(info.dims)
    rows = int(np.prod(outer))
    if info.type in ("F32", "F16", "BF16"):
        arr = data.reshape(rows, cols)
    else:
        arr = data.reshape(rows, -1)
    return Tensor(name, info.type, rows, cols, arr)


def validate_gguf(path: str) -> GGUFHeader:
    """Walk the header with bounds checks; raise ModelLoadError for the first problem found."""
    return _walk(path, lambda walker: walker.header())


def read_architecture(path: str) -> str | None:
    """general.architecture (None when the header has none) without walking the rest of the header: writers put
    it first, and the vocabulary's 10^5 strings that follow are most of a header's reading time. Raises
    ModelLoadError for a file that is not GGUF or breaks off before the key."""
    return _walk(path, lambda walker: walker.architecture())


def _walk(path: str, read: Callable[[_Walker], _T]) -> _T:
    """`read` over a _Walker of the mapped file; a file too short or unreadable is a ModelLoadError."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size < 24:
                raise ModelLoadError(path, f"file is too short to be GGUF ({size} bytes)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return read(_Walker(path, buf, size))
    except OSError as e:
        raise ModelLoadError(path, f"cannot read file: {e.strerror or e}") from e


class _Walker:
    def __init__(self, path: str, buf: mmap.mmap, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def fail(self, message: str) -> ModelLoadError:
        return ModelLoadError(self.path, message)

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(
                f"{what} at byte {self.pos} needs {n} bytes but only {self.size - self.pos} remain "
                f"(file truncated or corrupt)"
            )

    def unpack(self, fmt: str, what: str) -> int:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self, what: str) -> str:
        n = self.unpack("<Q", f"length of {what}")
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def strings(self, count: int, what: str) -> list[str]:
        """`count` strings (a vocabulary has 10^5 of them: read in C)."""
        out, pos, stopped = read_strings(self.buf, self.pos, count)
        self.pos = pos
        if stopped == STRINGS_NO_LENGTH:
            self.need(8, f"length of {what}[{len(out)}]")
        elif stopped == STRINGS_SHORT:
            n = struct.unpack_from("<Q", self.buf, pos - 8)[0]
            self.need(n, f"{what}[{len(out)}]")
        elif stopped == STRINGS_NOT_UTF8:
            raise self.fail(f"{what}[{len(out)}] is not valid UTF-8")
        return out

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        """The decoded value (lists for arrays)."""
        if vtype in _SCALAR_SIZES:
            self.need(_SCALAR_SIZES[vtype], what)
            start = self.pos
            self.pos += _SCALAR_SIZES[vtype]
            return np.frombuffer(self.buf, _NUMPY_TYPES[vtype], 1, start)[0].item()
        if vtype == _STRING:
            return self.string(what)
        if vtype != _ARRAY:
            raise self.fail(f"{what} has unknown value type {vtype}")
        if depth > 0:
            raise self.fail(f"{what} is a nested array, which is not supported")
        itype = self.unpack("<I", f"item type of {what}")
        count = self.unpack("<Q", f"length of {what}")
        if count > MAX_ARRAY_ITEMS:
            raise self.fail(f"{what} claims {count} items (limit {MAX_ARRAY_ITEMS})")
        if itype in _SCALAR_SIZES:
            self.need(count * _SCALAR_SIZES[itype], f"{what} ({count} items)")
            items = np.frombuffer(self.buf, _NUMPY_TYPES[itype], count, self.pos).tolist()
            self.pos += count * _SCALAR_SIZES[itype]
            return items
        if itype == _STRING:
            self.need(count * 8, f"{what} ({count} strings)")  # each string needs at least its length field
            return self.strings(count, what)
        raise self.fail(f"{what} has unsupported item type {itype}")

    def architecture(self) -> str | None:
        n_kv = self.preamble()[2]
        for i in range(n_kv):
            key = self.string(f"metadata key #{i}")
            value = self.value(self.unpack("<I", f"type of metadata {key!r}"), f"metadata {key!r}")
            if key == "general.architecture":
                return value if isinstance(value, str) else None
        return None

    def preamble(self) -> tuple[int, int, int]:
        """Magic and version checked: (version, tensor count, metadata count)."""
        if self.buf[:4] != MAGIC:
            raise self.fail(f"not a GGUF file (magic {bytes(self.buf[:4])!r}, expected {MAGIC!r})")
        self.pos = 4
        version = self.unpack("<I", "version")
        if version & 0xFFFF == 0 and version:
            raise self.fail("big-endian GGUF files are not supported")
        if version not in VERSIONS:
            raise self.fail(f"unsupported GGUF version {version} (supported: {', '.join(map(str, VERSIONS))})")
        return version, self.unpack("<Q", "tensor count"), self.unpack("<Q", "metadata count")

    def header(self) -> GGUFHeader:
        version, n_tensors, n_kv = self.preamble()
        # minimal sizes: a key/value is key length (8) + type (4) + a 1-byte value; a tensor info is
        # name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8)
        if n_kv * 13 > self.size - self.pos:
            raise self.fail(
                f"header claims {n_kv} metadata entries, more than the file ({self.size} bytes) can "
                f"hold: file truncated or corrupt"
            )
        if n_tensors > MAX_TENSORS or n_tensors * 32 > self.size - self.pos:
            raise self.fail(
                f"header claims {n_tensors} tensors, more than the file ({self.size} bytes) can hold: "
                f"file truncated or corrupt"
            )
        alignment = DEFAULT_ALIGNMENT
        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = self.string(f"metadata key #{i}")
            if key in metadata:
                raise self.fail(f"duplicate metadata key {key!r}")
            vtype = self.unpack("<I", f"type of metadata {key!r}")
            metadata[key] = self.value(vtype, f"metadata {key!r}")
            if key == "general.alignment":
                if vtype != 4:
                    raise self.fail("general.alignment must be a uint32")
                alignment = metadata[key]
                if alignment == 0 or alignment & (alignment - 1):
                    raise self.fail(f"general.alignment {alignment} is not a power of two")
        infos = [self.tensor_info(i) for i in range(n_tensors)]
        data_offset = -(-self.pos // alignment) * alignment
        names: set[str] = set()
        for t in infos:
            if t.name in names:
                raise self.fail(f"duplicate tensor name {t.name!r}")
            names.add(t.name)
            if t.offset % alignment:
                raise self.fail(f"tensor {t.name} offset {t.offset} is not aligned to {alignment}")
            t.offset += data_offset
            if t.offset + t.nbytes > self.size:
                raise self.fail(
                    f"tensor {t.name} data [{t.offset}, {t.offset + t.nbytes}) lies past the end of "
                    f"the file ({self.size} bytes): file truncated or offset corrupt"
                )
        spans = sorted((t.offset, t.offset + t.nbytes, t.name) for t in infos)
        for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
            if start < end:
                raise self.fail(f"tensors {a} and {b} overlap in the file")
        metadata = {k: v for k, v in metadata.items() if not k.startswith("GGUF.")}
        return GGUFHeader(version, alignment, data_offset, infos, metadata)

    def tensor_info(self, i: int) -> TensorInfo:
        name = self.string(f"name of tensor #{i}")
        n_dims = self.unpack("<I", f"dimension count of tensor {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        dims = tuple(self.unpack("<Q", f"dimension of tensor {name}") for _ in range(n_dims))
        raw_type = self.unpack("<I", f"type of tensor {name}")
        offset = self.unpack("<Q", f"offset of tensor {name}")
        if raw_type not in GGML_TYPES:
            raise self.fail(f"tensor {name} has unknown type id {raw_type}")
        type_name, block, type_size = GGML_TYPES[raw_type]
        if any(d == 0 for d in dims):
            raise self.fail(f"tensor {name} has an empty dimension {dims}")
        if dims[0] % block:
            raise self.fail(
                f"tensor {name}: row length {dims[0]} is not a multiple of the {type_name} block size {block}"
            )
        n_values = 1
        for d in dims:
            n_values *= d
        nbytes = n_values // block * type_size
        if nbytes > self.size:
            raise self.fail(f"tensor {name} of shape {dims} would need {nbytes} bytes, more than the whole file")
        return TensorInfo(name, dims, type_name, offset, nbytes)
