"""The prompt cache on disk below the server: the C copy of one KV block in and out, the KV manager's block source
and named inserts, and the file format's checks (torn, truncated, bit-flipped, foreign files are never loaded)."""

import logging
import zlib

import numpy as np
import pytest

from inferd.config import Settings
from inferd.engine.device import build_engine
from inferd.engine.kv_cache import KVCacheManager, hash_block
from inferd.engine.prompt_cache_disk import (
    CacheFile,
    CacheFileError,
    DiskPromptCache,
    Record,
    model_fingerprint,
    record_size,
    write_cache_file,
)
from inferd.engine.types import SamplingParams, SeqInput
from tests.reference import random_model

BS = 64


@pytest.fixture(scope="module", params=["f16", "q8_0"])
def engine(request):
    return build_engine(random_model(), Settings(num_kv_blocks=8, kv_cache_dtype=request.param, threads=1), max_seqs=2)


def test_a_block_image_round_trips_bit_for_bit_and_touches_no_other_block(engine):
    n = engine.kv_layout()["block_bytes"]
    cfg = engine.config
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim
    assert n == per_token * BS * 2 if engine.kv_cache_dtype == "f16" else n == per_token * BS * 17 // 16
    image = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8).tobytes()
    before = [engine.read_kv_block(b) for b in (2, 4)]
    engine.write_kv_block(3, image)
    assert engine.read_kv_block(3) == image
    assert [engine.read_kv_block(b) for b in (2, 4)] == before


def test_a_computed_block_moved_elsewhere_gives_the_same_next_token(engine):
    tokens = list(range(1, BS + 2))
    greedy = SamplingParams(temperature=0.0, logprobs=1)

    def run(table, start, toks):
        (out,) = engine.step([SeqInput(toks, start, table, 1, greedy)])
        return out

    full = run([0, 1], 0, tokens)  # the prompt's first block lands in block 0
    engine.write_kv_block(5, engine.read_kv_block(0))
    engine.write_kv_block(0, bytes(len(engine.read_kv_block(0))))  # the original is gone
    tail = run([5, 6], BS, tokens[BS:])  # only the last token is computed, over the moved block
    assert tail.tokens == full.tokens and tail.logprobs == full.logprobs


@pytest.mark.parametrize("bad", [-1, 8, 1 << 20])
def test_a_block_outside_the_cache_is_refused(engine, bad):
    n = engine.kv_layout()["block_bytes"]
    with pytest.raises(ValueError, match="outside the cache"):
        engine.read_kv_block(bad)
    with pytest.raises(ValueError, match="outside the cache"):
        engine.write_kv_block(bad, bytes(n))
    with pytest.raises(ValueError, match="bytes, got"):
        engine.write_kv_block(1, bytes(n - 1))


# ---- the KV manager's side -------------------------------------------------------------------------------------


class DictSource:
    def __init__(self, hashes):
        self.hashes, self.filled = set(hashes), []

    def __contains__(self, h):
        return h in self.hashes

    def fill(self, h, block_id):
        self.filled.append((h, block_id))
        return True


def chain(tokens):
    out, parent = [], None
    for i in range(len(tokens) // BS):
        parent = hash_block(parent, tokens[i * BS : (i + 1) * BS])
        out.append(parent)
    return out


def test_a_prompt_hits_blocks_from_the_source_and_they_are_cached_after():
    kv = KVCacheManager(8, BS)
    prompt = list(range(3 * BS + 5))
    hashes = chain(prompt)
    kv.block_source = DictSource(hashes[:2])
    assert kv.match_prefix("a", prompt, len(prompt) - 1) == 2 * BS
    assert kv.source_hits == 2 * BS and kv.prefix_hits == 2 * BS
    assert [h for h, _ in kv.block_source.filled] == hashes[:2]
    kv.free("a")
    kv.block_source = None
    assert kv.match_prefix("b", prompt, len(prompt) - 1) == 2 * BS  # now from memory
    assert kv.source_hits == 2 * BS


def test_cached_blocks_lists_the_most_recent_chains_first_parents_before_children():
    kv = KVCacheManager(16, BS)
    old, new = list(range(2 * BS)), list(range(1000, 1000 + 3 * BS))
    for seq, toks in (("old", old), ("new", new)):
        kv.match_prefix(seq, toks, 0)
        kv.allocate(seq, len(toks))
        kv.cache_blocks(seq, toks, len(toks))
        kv.free(seq)
    kv.match_prefix("again", old[:BS] + [7] * BS, 2 * BS - 1)  # the old chain's first block is hit last
    order = [b.block_hash for b in kv.cached_blocks()]
    assert order == chain(old)[:1] + chain(new) + chain(old)[1:]
    assert [b.token_ids for b in kv.cached_blocks()][:1] == [tuple(old[:BS])]


def test_insert_cached_needs_the_parent_and_a_free_block():
    kv = KVCacheManager(2, BS)
    toks = list(range(3 * BS))
    h = chain(toks)
    assert not kv.insert_cached(h[1], h[0], toks[BS : 2 * BS], lambda b: True)  # parent not cached
    assert kv.insert_cached(h[0], None, toks[:BS], lambda b: True)
    assert not kv.insert_cached(h[1], h[0], toks[BS : 2 * BS], lambda b: False)  # the copy failed
    assert kv.insert_cached(h[1], h[0], toks[BS : 2 * BS], lambda b: True)
    assert kv.match_prefix("s", toks, len(toks) - 1) == 2 * BS
    assert kv.stats().num_free == 0


# ---- files -------------------------------------------------------------------------------------------------------

LAYOUT = {"engine": "cpu", "kv_cache_dtype": "f16", "block_size": BS, "n_layers": 1, "n_kv_heads": 1,
          "head_dim": 8, "block_bytes": 32}


def records(n=3):
    toks = list(range(n * BS))
    out, parent = [], None
    for i, h in enumerate(chain(toks)):
        out.append(Record(h, parent, tuple(toks[i * BS : (i + 1) * BS]), bytes([i]) * 32))
        parent = h
    return out


def test_a_file_reads_back_what_was_written(tmp_path):
    path = tmp_path / "m.kvc"
    rs = records()
    assert write_cache_file(path, "fp", LAYOUT, rs) == path.stat().st_size
    f = CacheFile(path, "fp", LAYOUT)
    assert list(f.records()) == rs
    assert f.read(rs[1].block_hash) == rs[1]
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("damage, reason", [
    (lambda b: b[:-7], "torn or truncated"),
    (lambda b: b + b"x", "torn or truncated"),
    (lambda b: b[:20], "header"),
    (lambda b: b[:12] + bytes([b[12] ^ 1]) + b[13:], "checksum"),
    (lambda b: b"NOTAFILE" + b[8:], "not an inferd prompt cache"),
])
def test_a_damaged_header_or_length_is_refused(tmp_path, damage, reason):
    path = tmp_path / "m.kvc"
    write_cache_file(path, "fp", LAYOUT, records())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CacheFileError, match=reason):
        CacheFile(path, "fp", LAYOUT)


def test_another_model_or_layout_is_refused(tmp_path):
    path = tmp_path / "m.kvc"
    write_cache_file(path, "fp", LAYOUT, records())
    with pytest.raises(CacheFileError, match="another model"):
        CacheFile(path, "other", LAYOUT)
    with pytest.raises(CacheFileError, match="another KV layout"):
        CacheFile(path, "fp", {**LAYOUT, "kv_cache_dtype": "q8_0"})


def test_a_flipped_bit_in_a_record_is_caught_when_read(tmp_path):
    path = tmp_path / "m.kvc"
    rs = records()
    write_cache_file(path, "fp", LAYOUT, rs)
    raw = bytearray(path.read_bytes())
    raw[-record_size(LAYOUT) - 10] ^= 0x10  # inside the second record's image
    path.write_bytes(bytes(raw))
    f = CacheFile(path, "fp", LAYOUT)  # the index itself is fine
    assert f.read(rs[0].block_hash) == rs[0]
    with pytest.raises(CacheFileError, match="checksum"):
        f.read(rs[1].block_hash)


class FakeEngine:
    def __init__(self):
        self.blocks = {}

    def kv_layout(self):
        return LAYOUT

    def read_kv_block(self, block_id):
        return self.blocks[block_id]

    def write_kv_block(self, block_id, image):
        self.blocks[block_id] = image


def test_the_disk_cache_drops_a_corrupt_file_with_one_log_line(tmp_path, caplog):
    rs = records()
    write_cache_file(tmp_path / "fp.kvc", "fp", LAYOUT, rs)
    raw = bytearray((tmp_path / "fp.kvc").read_bytes())
    raw[-5] ^= 1  # the last record
    (tmp_path / "fp.kvc").write_bytes(bytes(raw))
    kv = KVCacheManager(8, BS)
    disk = DiskPromptCache(tmp_path, 1 << 20, "fp", FakeEngine(), kv)
    disk.open()
    prompt = list(range(3 * BS + 1))
    with caplog.at_level(logging.WARNING, "inferd.prompt_cache"):
        assert kv.match_prefix("a", prompt, len(prompt) - 1) == 2 * BS
    assert [r.message for r in caplog.records if "no longer used" in r.message] != []
    assert len(caplog.records) == 1 and kv.block_source is None and disk.files_skipped == 1


def test_save_keeps_the_budget_and_the_last_runs_unused_blocks(tmp_path):
    engine, kv = FakeEngine(), KVCacheManager(8, BS)
    old = records(3)
    write_cache_file(tmp_path / "fp.kvc", "fp", LAYOUT, old)
    disk = DiskPromptCache(tmp_path, 4 * record_size(LAYOUT), "fp", engine, kv)
    disk.open()
    toks = list(range(5000, 5000 + 2 * BS))
    kv.match_prefix("s", toks, 0)
    kv.allocate("s", len(toks))
    for b in kv.block_table("s"):
        engine.blocks[b] = bytes([9]) * 32
    kv.cache_blocks("s", toks, len(toks))
    assert disk.save() == 4  # this run's 2 blocks, then the file's first 2 (its chain's head)
    f = CacheFile(tmp_path / "fp.kvc", "fp", LAYOUT)
    assert [r.block_hash for r in f.records()] == chain(toks) + [r.block_hash for r in old[:2]]


def test_named_paths_stay_in_the_folder(tmp_path):
    disk = DiskPromptCache(tmp_path, 1 << 20, "fp", FakeEngine(), KVCacheManager(4, BS))
    assert disk.named_path("chat-1.v2_x") == tmp_path / "named" / "chat-1.v2_x.kvc"
    for bad in ("", "../x", "a/b", ".hidden", "..", "a" * 65, "x\0y", "é"):
        with pytest.raises(ValueError, match="a cache name"):
            disk.named_path(bad)


def test_the_fingerprint_changes_with_the_file(tmp_path):
    p = tmp_path / "m.gguf"
    p.write_bytes(b"GGUF" + bytes(300_000))
    a = model_fingerprint(p)
    assert model_fingerprint(p) == a and model_fingerprint(p, "q8_0") != a
    p.write_bytes(b"GGUF" + bytes(150_000) + b"x" + bytes(149_999))
    assert model_fingerprint(p) != a


def test_save_drops_the_last_runs_blocks_when_one_went_bad(tmp_path, caplog):
    engine, kv = FakeEngine(), KVCacheManager(8, BS)
    write_cache_file(tmp_path / "fp.kvc", "fp", LAYOUT, records(2))
    disk = DiskPromptCache(tmp_path, 1 << 20, "fp", engine, kv)
    disk.open()
    raw = bytearray((tmp_path / "fp.kvc").read_bytes())
    raw[-5] ^= 1  # after indexing: found only when the save copies it
    (tmp_path / "fp.kvc").write_bytes(bytes(raw))
    disk.file = CacheFile(tmp_path / "fp.kvc", "fp", LAYOUT)
    toks = list(range(7000, 7000 + BS))
    kv.match_prefix("s", toks, 0)
    kv.allocate("s", BS)
    engine.blocks[kv.block_table("s")[0]] = bytes([3]) * 32
    kv.cache_blocks("s", toks, BS)
    with caplog.at_level(logging.WARNING, "inferd.prompt_cache"):
        assert disk.save() == 1
    assert "not kept" in caplog.records[0].getMessage()
    assert [r.token_ids for r in CacheFile(tmp_path / "fp.kvc", "fp", LAYOUT).records()] == [tuple(toks)]
    assert not list(tmp_path.glob(".*.tmp"))


# ---- tails: a sequence's last, partly filled block ---------------------------------------------------------------


def tail_record(parent, tokens, fill=7):
    return Record(hash_block(parent, tokens), parent, tuple(tokens), bytes([fill]) * 32)


def test_a_tail_record_reads_back_and_a_bad_token_count_is_refused(tmp_path):
    path = tmp_path / "m.kvc"
    rs = records(2)
    rs.append(tail_record(rs[-1].block_hash, (5, 6, 7)))
    write_cache_file(path, "fp", LAYOUT, rs)
    f = CacheFile(path, "fp", LAYOUT)
    assert list(f.records()) == rs and f.read(rs[2].block_hash).token_ids == (5, 6, 7)
    i, n = f.tails.longest(rs[1].block_hash, (5, 6, 9))
    assert n == 2 and f.tail_records[i] == ((5, 6, 7), rs[2].block_hash)
    for n in (0, BS + 1):  # a token count no record can have, its checksum made right
        raw = bytearray(path.read_bytes())
        at = len(raw) - record_size(LAYOUT)
        raw[at + 36 : at + 40] = n.to_bytes(4, "little")
        body = bytes(raw[at : len(raw) - 4])
        raw[len(raw) - 4 :] = zlib.crc32(body).to_bytes(4, "little")
        path.write_bytes(bytes(raw))
        with pytest.raises(CacheFileError, match=f"a record of {n} tokens"):
            CacheFile(path, "fp", LAYOUT).read(rs[2].block_hash)


def test_a_version_1_file_of_whole_blocks_is_still_read(tmp_path):
    path = tmp_path / "m.kvc"
    rs = records(2)
    write_cache_file(path, "fp", LAYOUT, rs)
    raw = bytearray(path.read_bytes())
    meta_len = int.from_bytes(raw[12:16], "little")
    raw[8:12] = (1).to_bytes(4, "little")
    end = 16 + meta_len
    raw[end : end + 4] = zlib.crc32(bytes(raw[:end])).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    assert list(CacheFile(path, "fp", LAYOUT).records()) == rs


class CopyingEngine(FakeEngine):
    """A fake engine whose KV blocks can be copied: the KV manager's hits within a block."""

    def copy(self, src, dst):
        self.blocks[dst] = self.blocks[src]


def served(tmp_path):
    """A process's engine, KV manager and disk cache over the folder (a new one per restart)."""
    engine, kv = CopyingEngine(), KVCacheManager(8, BS)
    kv.copy_block = engine.copy
    disk = DiskPromptCache(tmp_path, 1 << 20, "fp", engine, kv)
    disk.open()
    return engine, kv, disk


def run_and_free(engine, kv, tokens, num_computed):
    """A sequence over `tokens` with its first num_computed computed (block i's K/V the bytes i + 1), then freed:
    its last, partly filled block becomes a tail."""
    kv.match_prefix("s", tokens, 0)
    kv.allocate("s", len(tokens))
    for i, b in enumerate(kv.block_table("s")):
        engine.blocks[b] = bytes([i + 1]) * 32
    kv.cache_blocks("s", tokens, num_computed)
    kv.free("s")


def test_a_tail_saved_at_shutdown_is_hit_to_the_token_after_a_restart(tmp_path):
    engine, kv, disk = served(tmp_path)
    conversation = list(range(100, 100 + BS + 10))
    run_and_free(engine, kv, conversation, len(conversation))  # its last 10 tokens: a tail
    assert disk.save() == 2
    saved = list(CacheFile(tmp_path / "fp.kvc", "fp", LAYOUT).records())
    assert [r.token_ids for r in saved] == [tuple(conversation[:BS]), tuple(conversation[BS:])]

    engine, kv, disk = served(tmp_path)  # a new process
    follow_up = conversation + [7, 8]
    assert kv.match_prefix("t", follow_up, len(follow_up) - 1) == BS + 10
    assert kv.source_hits == BS + 10 and disk.bytes_read == 2 * record_size(LAYOUT)
    assert engine.blocks[kv.block_table("t")[1]] == bytes([2]) * 32  # the tail's K/V, copied into t's own block
    assert disk.save() == 2  # the tail, now cached again, is kept once


def test_a_named_save_takes_the_tail_and_a_restore_puts_it_back(tmp_path):
    engine, kv, disk = served(tmp_path)
    prompt = list(range(300, 300 + BS + 5))
    run_and_free(engine, kv, prompt + [1, 2], len(prompt) + 1)  # two generated tokens, one of them computed
    records_, n = disk.chain_records(prompt)
    assert n == BS + 5 and [r.token_ids for r in records_] == [tuple(prompt[:BS]), tuple(prompt[BS:])]
    disk.write_named("chat", records_)

    engine, kv, disk = served(tmp_path)
    assert disk.insert(disk.read_named("chat")) == BS + 5
    assert kv.match_prefix("t", prompt + [9], BS + 5) == BS + 5 and kv.source_hits == 0
    assert engine.blocks[kv.block_table("t")[1]] == bytes([2]) * 32
