"""The prefix cache on disk: blocks written at shutdown, read back lazily by the next run, and named saves.

File format (little-endian), one file per model:
    header  "INFERDKV" | u32 version | u32 meta length | meta (JSON) | u32 crc32 of all before it
    records (meta["records"] of them, each of the same size)
            16 bytes block hash | 16 bytes parent hash | u8 has parent | 3 pad | u32 tokens
            | block_size x i32 (the tokens, then zeros) | the block's KV image (Engine.read_kv_block)
            | u32 crc32 of the record before it
A record of fewer tokens than a block holds is a tail (kv_cache.py: a sequence's last, partly filled block), its
hash that of its parent and its tokens as for a whole block; a tail is found by its parent and tokens, not in a chain.
The meta holds the model file's fingerprint (size, mtime, a hash of its header and of a few samples of its bytes:
cheap, not the whole file) and the KV layout (format, shapes, block size and image bytes). A file whose header
does not check out, whose fingerprint or layout differs from this run's, or whose size is not exactly header +
records is skipped whole with one log line. Records are checked when read: a record whose checksum, hash chain
or token count is wrong is not loaded, and the file is not used again. Every length read from a file is checked
against the file's size and against the layout before it is used.

Records are written most recently hit first, each after its parent, so a file cut short by the byte budget still
holds whole chains. Writes go to a temporary file in the same folder, renamed over the old one (atomic).

Everything that touches the KV pool (fill, saving) runs on the scheduler thread: the engine has one owner.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import struct
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from inferd.engine.child_blocks import ChildBlocks
from inferd.engine.kv_cache import KVCacheManager, hash_block

log = logging.getLogger("inferd.prompt_cache")

MAGIC = b"INFERDKV"
VERSION = 2  # 1: whole blocks only; its files are read as they are
HEAD = struct.Struct("<8sII")
RECORD_HEAD = struct.Struct("<16s16sB3xI")
CRC = struct.Struct("<I")
MAX_META_BYTES = 1 << 16
SAMPLE_BYTES = 1 << 16  # bytes hashed at each sampled offset of a model file
HEADER_BYTES = 1 << 20  # the first bytes of a model file (a GGUF header and its tensor table), hashed whole
SUFFIX = ".kvc"
NAMED_FOLDER = "named"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # a file stem: no separator, no leading dot
MAX_NAMED = 64  # named saves kept in the folder at once


class BlockImages(Protocol):
    """The engine as this module uses it (Engine)."""

    def kv_layout(self) -> dict[str, object]: ...
    def read_kv_block(self, block_id: int) -> bytes: ...
    def write_kv_block(self, block_id: int, image: bytes) -> None: ...


@dataclass(frozen=True)
class Record:
    block_hash: bytes
    parent: bytes | None
    token_ids: tuple[int, ...]
    image: bytes


class CacheFileError(ValueError):
    """A cache file that must not be loaded; the message says why."""


# ---- fingerprints ---------------------------------------------------------------------------------------------


def _file_digest(path: Path, h: Any) -> None:
    st = path.stat()
    h.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    with open(path, "rb") as f:
        h.update(f.read(HEADER_BYTES))
        for fraction in (1, 2, 3, 4):
            f.seek(max(0, st.st_size * fraction // 4 - SAMPLE_BYTES))
            h.update(f.read(SAMPLE_BYTES))


def model_fingerprint(model_path: str | os.PathLike[str], quantize: str = "") -> str:
    """A hex digest that changes when the model file (or any file of a model folder) is replaced or edited, and
    with the load-time quantization, which changes the weights the KV was computed with."""
    path = Path(model_path)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"quantize={quantize};".encode())
    files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")) if path.is_dir() else [path]
    for p in files:
        _file_digest(p, h)
    return h.hexdigest()


# ---- one file ---------------------------------------------------------------------------------------------------


def record_size(layout: dict[str, Any]) -> int:
    return RECORD_HEAD.size + 4 * int(layout["block_size"]) + int(layout["block_bytes"]) + CRC.size


def encode_record(r: Record, block_size: int) -> bytes:
    head = RECORD_HEAD.pack(r.block_hash, r.parent or bytes(16), r.parent is not None, len(r.token_ids))
    tokens = struct.pack(f"<{len(r.token_ids)}i", *r.token_ids) + bytes(4 * (block_size - len(r.token_ids)))
    body = head + tokens + r.image
    return body + CRC.pack(zlib.crc32(body))


def decode_record(raw: bytes, layout: dict[str, Any]) -> Record:
    """A record's fields, checked: its checksum, its token count and that its hash is its chain's."""
    if len(raw) != record_size(layout):
        raise CacheFileError(f"a record of {len(raw)} bytes, not {record_size(layout)}")
    body, (crc,) = raw[: -CRC.size], CRC.unpack(raw[-CRC.size :])
    if zlib.crc32(body) != crc:
        raise CacheFileError("a record's checksum does not match")
    h, parent, has_parent, n = RECORD_HEAD.unpack_from(body)
    bs = layout["block_size"]
    if not 0 < n <= bs:
        raise CacheFileError(f"a record of {n} tokens in blocks of {bs}")
    tokens = struct.unpack_from(f"<{n}i", body, RECORD_HEAD.size)
    up = parent if has_parent else None
    if hash_block(up, tokens) != h:
        raise CacheFileError("a record's hash is not that of its parent and tokens")
    return Record(h, up, tokens, body[RECORD_HEAD.size + 4 * bs :])


def write_cache_file(
    path: Path, fingerprint: str, layout: dict[str, Any], records: Iterable[Record], count: int | None = None
) -> int:
    """Writes `records` (parents before children; `count` of them, when given, so that they can be made one at a
    time instead of held together) to `path` atomically; returns the bytes written."""
    if count is None:
        records = list(records)
        count = len(records)
    meta = json.dumps({"fingerprint": fingerprint, "layout": layout, "records": count}).encode()
    head = HEAD.pack(MAGIC, VERSION, len(meta)) + meta
    head += CRC.pack(zlib.crc32(head))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            written = 0
            for r in records:
                if written == count:
                    break
                f.write(encode_record(r, int(layout["block_size"])))
                written += 1
            if written != count:
                raise ValueError(f"{written} records where {count} were announced")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return len(head) + count * record_size(layout)


class CacheFile:
    """An opened cache file: its index (hash -> offset), read on open; records read on demand."""

    def __init__(self, path: Path, fingerprint: str, layout: dict[str, Any]):
        """Raises CacheFileError when the file is torn, truncated, foreign or corrupt; OSError when unreadable."""
        self.path = path
        self.layout = layout
        self.parents: dict[bytes, bytes | None] = {}
        self.tails = ChildBlocks()  # the tail records by parent, each under its index in tail_records
        self.tail_records: list[tuple[tuple[int, ...], bytes]] = []  # (tokens, hash)
        self._f = open(path, "rb")
        try:
            self.index = self._read_index(fingerprint)
        except BaseException:
            self._f.close()
            raise

    def _read_index(self, fingerprint: str) -> dict[bytes, int]:
        size = os.fstat(self._f.fileno()).st_size
        raw = self._f.read(HEAD.size)
        if len(raw) < HEAD.size:
            raise CacheFileError(f"{size} bytes: shorter than a header")
        magic, version, meta_len = HEAD.unpack(raw)
        if magic != MAGIC or version not in (1, VERSION):
            raise CacheFileError("not an inferd prompt cache file of this version")
        if meta_len > MAX_META_BYTES or HEAD.size + meta_len + CRC.size > size:
            raise CacheFileError("a header longer than the file")
        meta_raw = self._f.read(meta_len)
        (crc,) = CRC.unpack(self._f.read(CRC.size))
        if zlib.crc32(raw + meta_raw) != crc:
            raise CacheFileError("the header's checksum does not match")
        meta = json.loads(meta_raw)
        if meta.get("fingerprint") != fingerprint:
            raise CacheFileError("written for another model file")
        if meta.get("layout") != self.layout:
            raise CacheFileError(f"written for another KV layout ({meta.get('layout')})")
        start, step, count = HEAD.size + meta_len + CRC.size, record_size(self.layout), int(meta["records"])
        bs = int(self.layout["block_size"])
        if count < 0 or start + count * step != size:
            raise CacheFileError(f"{size} bytes where its header promises {start + count * step}: torn or truncated")
        index: dict[bytes, int] = {}
        for i in range(count):
            head = os.pread(self._f.fileno(), RECORD_HEAD.size, start + i * step)
            h, parent, has_parent, n = RECORD_HEAD.unpack(head)
            if h not in index:
                index[h] = start + i * step
                # unchecked until the record is read (its checksum covers it): only used to choose what to keep
                # and, for a tail, which one to read
                up = self.parents[h] = parent if has_parent else None
                if 0 < n < bs:
                    raw = os.pread(self._f.fileno(), 4 * n, start + i * step + RECORD_HEAD.size)
                    tokens = struct.unpack(f"<{n}i", raw)
                    self.tails.add(up, tokens, len(self.tail_records))
                    self.tail_records.append((tokens, h))
        return index

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.index

    def read(self, block_hash: bytes) -> Record:
        """The record of `block_hash`, checked (CacheFileError if it is corrupt)."""
        raw = os.pread(self._f.fileno(), record_size(self.layout), self.index[block_hash])
        r = decode_record(raw, self.layout)
        if r.block_hash != block_hash:
            raise CacheFileError("a record is not where the index put it")
        return r

    def records(self) -> Iterator[Record]:
        """Every record in file order (most recently hit first, as written), checked."""
        for h in sorted(self.index, key=self.index.__getitem__):
            yield self.read(h)

    def close(self) -> None:
        self._f.close()


def open_cache_file(path: Path, fingerprint: str, layout: dict[str, Any]) -> CacheFile | None:
    """The file, or None (with one log line) when it is missing, unreadable or must not be loaded."""
    try:
        return CacheFile(path, fingerprint, layout)
    except FileNotFoundError:
        return None
    except (CacheFileError, OSError, ValueError, KeyError, TypeError) as e:
        log.warning("prompt cache file %s skipped: %s", path, e)
        return None


# ---- the cache of one model -------------------------------------------------------------------------------------


class DiskPromptCache:
    """The prefix cache's disk side for one engine: the file of the last run as the KV manager's block source,
    the save at shutdown, and named saves of one conversation. Counters are read by the metrics."""

    def __init__(
        self, folder: Path, budget_bytes: int, fingerprint: str, engine: BlockImages, kv: KVCacheManager
    ) -> None:
        self.folder = folder
        self.budget_bytes = budget_bytes
        self.fingerprint = fingerprint
        self.engine = engine
        self.kv = kv
        self.layout = dict(engine.kv_layout())
        self.path = folder / f"{fingerprint}{SUFFIX}"
        self.bytes_written = 0
        self.bytes_read = 0
        self.files_skipped = 0
        self.file: CacheFile | None = None

    @property
    def max_records(self) -> int:
        return self.budget_bytes // record_size(self.layout)

    def open(self) -> None:
        """Index the last run's file and hand it to the KV manager: a prompt whose blocks it holds hits them."""
        for stale in self.folder.glob(f".{self.path.name}.*.tmp"):  # a save cut short by a kill
            stale.unlink(missing_ok=True)
        self.file = open_cache_file(self.path, self.fingerprint, self.layout)
        if self.file is None and self.path.exists():
            self.files_skipped += 1
        if self.file is not None:
            log.info("prompt cache: %d blocks on disk in %s", len(self.file.index), self.path)
            self.kv.block_source = self

    # ---- BlockSource (scheduler thread) ---------------------------------------------------------------------

    def __contains__(self, block_hash: bytes) -> bool:
        return self.file is not None and block_hash in self.file

    def longest_tail(self, parent: bytes | None, token_ids: Sequence[int]) -> tuple[tuple[int, ...], bytes] | None:
        if self.file is None:
            return None
        i, n = self.file.tails.longest(parent, token_ids)
        return self.file.tail_records[i] if n else None

    def fill(self, block_hash: bytes, block_id: int) -> bool:
        f = self.file
        if f is None:
            return False
        try:
            r = f.read(block_hash)
        except (CacheFileError, OSError) as e:
            log.warning("prompt cache file %s no longer used: %s", f.path, e)
            self._drop_file()
            return False
        self.engine.write_kv_block(block_id, r.image)
        self.bytes_read += record_size(self.layout)
        return True

    def _drop_file(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
            self.files_skipped += 1
        self.kv.block_source = None

    # ---- saving (scheduler thread, or once it has stopped) ----------------------------------------------------

    def save(self) -> int:
        """Write the blocks worth keeping: the cached ones, most recently hit first, then those of the last run's
        file that were not used this run, within the budget. Returns the number of blocks written. Blocks are chosen
        first and their bytes read one at a time while writing, so the save needs no memory of its size."""
        limit = self.max_records
        chosen: list[tuple[bytes, int | None]] = []  # (hash, KV block id), or (hash, None): from the last file
        kept: set[bytes] = set()
        for b in self.kv.cached_blocks():
            if len(chosen) >= limit:
                break
            if b.parent is None or b.parent in kept:
                chosen.append((b.block_hash, b.block_id))
                kept.add(b.block_hash)
        old = self.file
        if old is not None:
            for h in sorted(old.index, key=old.index.__getitem__):
                if len(chosen) >= limit:
                    break
                parent = old.parents[h]
                if h not in kept and (parent is None or parent in kept):
                    chosen.append((h, None))
                    kept.add(h)
        if not chosen:
            return 0

        def records() -> Iterator[Record]:
            for h, block_id in chosen:
                if block_id is None:
                    assert old is not None
                    yield old.read(h)
                else:
                    b = self.kv.block_parent[block_id], self.kv.block_tokens[block_id]
                    yield Record(h, b[0], b[1], self.engine.read_kv_block(block_id))

        try:
            self.bytes_written += write_cache_file(self.path, self.fingerprint, self.layout, records(), len(chosen))
        except CacheFileError as e:  # a block of the last file went bad since it was indexed: keep this run's
            log.warning("prompt cache file %s: its unused blocks are not kept: %s", self.path, e)
            self._drop_file()
            return self.save()
        log.info("prompt cache: %d blocks written to %s", len(chosen), self.path)
        return len(chosen)

    # ---- named saves ------------------------------------------------------------------------------------------

    def named_path(self, name: str) -> Path:
        """The file of a named save; ValueError for a name outside the safe set (no path can be made of one)."""
        if not NAME_RE.fullmatch(name):
            raise ValueError(
                "a cache name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )
        return self.folder / NAMED_FOLDER / f"{name}{SUFFIX}"

    def chain_records(self, token_ids: Sequence[int]) -> tuple[list[Record], int]:
        """The cached blocks of `token_ids`' prefix, in order, as records, then, where hits within a block are, the
        tokens after them that the last one's cached children start with most (a tail record of that child's KV);
        and how many of `token_ids` they hold (scheduler thread)."""
        out: list[Record] = []
        parent: bytes | None = None
        bs, kv = self.kv.block_size, self.kv
        for i in range(min(len(token_ids) // bs, self.max_records)):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = hash_block(parent, chunk)
            block_id = kv.hash_to_block.get(h)
            if block_id is None:
                break
            out.append(Record(h, parent, chunk, self.engine.read_kv_block(block_id)))
            parent = h
        num_tokens = len(out) * bs
        if kv.hits_within_block and len(out) < self.max_records:
            block_id, n = kv.children.longest(parent, token_ids[num_tokens : num_tokens + bs])
            if n:  # the child's first n positions hold these tokens' K/V, whatever it holds past them
                shared = tuple(token_ids[num_tokens : num_tokens + n])
                out.append(Record(hash_block(parent, shared), parent, shared, self.engine.read_kv_block(block_id)))
                num_tokens += n
        return out, num_tokens

    def write_named(self, name: str, records: Sequence[Record]) -> int:
        """Writes a named save (any thread); ValueError when the folder already holds MAX_NAMED others."""
        path = self.named_path(name)
        if not path.exists() and len(self.named()) >= MAX_NAMED:
            raise ValueError(f"{MAX_NAMED} named caches are saved already; restore into or overwrite one")
        n = write_cache_file(path, self.fingerprint, self.layout, records)
        self.bytes_written += n
        return n

    def read_named(self, name: str) -> list[Record]:
        """A named save's records, checked (any thread). FileNotFoundError when there is none, CacheFileError when
        it must not be loaded."""
        path = self.named_path(name)
        try:
            f = CacheFile(path, self.fingerprint, self.layout)
        except CacheFileError as e:
            log.warning("named prompt cache %s skipped: %s", path, e)
            raise
        try:
            if len(f.index) > self.max_records:
                raise CacheFileError(f"{len(f.index)} blocks, more than prompt_cache_disk_mib holds")
            records = list(f.records())
        except CacheFileError as e:
            log.warning("named prompt cache %s skipped: %s", path, e)
            raise
        finally:
            f.close()
        self.bytes_read += len(records) * record_size(self.layout)
        return records

    def insert(self, records: Iterable[Record]) -> int:
        """Put records in the prefix cache as if computed, until one cannot be (scheduler thread); returns how many
        tokens they hold."""
        n = 0
        for r in records:
            if not self.kv.insert_cached(r.block_hash, r.parent, r.token_ids, self._writer(r.image)):
                break
            n += len(r.token_ids)
        return n

    def _writer(self, image: bytes) -> Callable[[int], bool]:
        def write(block_id: int) -> bool:
            self.engine.write_kv_block(block_id, image)
            return True

        return write

    def named(self) -> list[str]:
        folder = self.folder / NAMED_FOLDER
        return sorted(p.stem for p in folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []
