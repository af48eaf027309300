"""Prefix hits within a block (kv_cache.py): a prompt whose chain of whole cached blocks ends mid-block copies the
cached block that starts with the most of its next tokens. The copies here move labels in a dict standing for the
engine's KV memory, so each test can say which block's contents a sequence ended up with; the engine's own copy is
tested with real K/V in test_prefix_within_block.py."""

from inferd.engine.child_blocks import common_prefix
from inferd.engine.kv_cache import KVCacheManager, hash_block

BS = 4


def toks(n, start=0):
    return list(range(start, start + n))


class Memory:
    """What each KV block holds: a label per block, moved by copy_block."""

    def __init__(self, kv: KVCacheManager):
        self.contents: dict[int, str] = {}
        self.copies: list[tuple[int, int]] = []
        kv.copy_block = self.copy

    def copy(self, src: int, dst: int) -> None:
        assert src != dst
        self.copies.append((src, dst))
        self.contents[dst] = self.contents.get(src, "")


def run(kv, seq_id, token_ids, computed=None, cap=None):
    """A sequence matched, allocated and computed up to `computed` positions (all of them by default)."""
    cached = kv.match_prefix(seq_id, token_ids, len(token_ids) - 1 if cap is None else cap)
    kv.allocate(seq_id, len(token_ids))
    kv.cache_blocks(seq_id, token_ids, len(token_ids) if computed is None else computed)
    return cached


def test_a_finished_sequences_last_block_is_hit_by_a_copy():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    mem = Memory(kv)
    assert run(kv, "a", toks(10)) == 0
    tail_block = kv.block_table("a")[2]
    mem.contents[tail_block] = "a's positions 8-9"
    kv.free("a")
    assert kv.tails == {tail_block} and kv.stats().num_cached_free == 3

    b = toks(10) + [50, 51]
    assert kv.match_prefix("b", b, len(b) - 1) == 10  # two whole blocks, then 8 and 9 out of the tail
    table = kv.block_table("b")
    assert len(table) == 3 and table[2] != tail_block
    assert mem.copies == [(tail_block, table[2])] and mem.contents[table[2]] == "a's positions 8-9"
    assert kv.ref_counts[tail_block] == 0 and tail_block in kv.tails  # still cached, for the next one
    s = kv.stats()
    assert (s.prefix_queries, s.prefix_hits) == (22, 10)


def test_a_full_cached_block_is_hit_by_its_first_tokens():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    Memory(kv)
    run(kv, "a", toks(13))  # blocks 0-2 full and hashed
    b = toks(10) + [70, 71, 72]
    assert kv.match_prefix("b", b, len(b) - 1) == 10
    assert kv.block_table("b")[:2] == kv.block_table("a")[:2]
    assert kv.block_table("b")[2] not in kv.block_table("a")


def test_the_cap_bounds_the_copy_too():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    Memory(kv)
    run(kv, "a", toks(13))
    assert kv.match_prefix("b", toks(10), 9) == 9  # the prompt's last token must run
    assert kv.match_prefix("c", toks(11), 8) == 8  # whole blocks only: nothing left to copy


def test_no_copy_without_a_copier_or_with_recurrent_state():
    for kv in (KVCacheManager(8, BS), KVCacheManager(8, BS, num_state_slots=2)):
        if kv.num_state_slots:
            Memory(kv)
        run(kv, "a", toks(10))
        kv.free("a")
        assert not kv.tails
        assert kv.match_prefix("b", toks(10) + [50], 10) == (0 if kv.num_state_slots else 8)


def test_a_tail_only_uncomputed_positions_past_is_not_kept():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    mem = Memory(kv)
    run(kv, "a", toks(12), computed=9)  # positions 9-11 allocated, not computed
    tail = kv.block_table("a")[2]
    kv.free("a")
    assert kv.block_tokens[tail] == (8,)
    assert kv.match_prefix("b", toks(12), 11) == 9
    assert mem.copies == [(tail, kv.block_table("b")[2])]


def test_a_tail_another_block_already_covers_is_not_kept():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    Memory(kv)
    run(kv, "a", toks(10))
    kv.free("a")
    run(kv, "b", toks(10) + [20])  # copies a's tail, computes one more
    run(kv, "c", toks(10))
    kv.free("c")  # its last block starts like a's tail and holds nothing more: plain free
    kv.free("b")
    assert len(kv.tails) == 2
    assert sorted(kv.block_tokens[b] for b in kv.tails) == [(8, 9), (8, 9, 20)]


def test_evicted_tails_leave_the_index():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    Memory(kv)
    run(kv, "a", toks(10))
    kv.free("a")
    run(kv, "b", toks(16, start=100))  # takes all four blocks: a's three cached ones evicted, tail first
    assert not kv.tails and len(kv.children) == 4  # b's four whole blocks
    kv.free("b")
    assert kv.match_prefix("c", toks(10) + [1], 10) == 0


def test_the_source_is_not_evicted_to_make_its_own_copy():
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    mem = Memory(kv)
    run(kv, "a", toks(10))
    kv.free("a")  # every block cached and free: the two b hits and the tail, its only possible copy's source
    assert kv.match_prefix("b", toks(10) + [1], 10) == 8
    assert mem.copies == [] and len(kv.tails) == 1 and kv.stats().num_cached_free == 1


def test_a_preempted_sequence_hits_its_own_tail():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    mem = Memory(kv)
    run(kv, "a", toks(9))
    kv.allocate("a", 11)
    kv.cache_blocks("a", toks(9) + [40, 41], 10)  # generated 40 and 41; 40 computed
    kv.free("a")  # preempted: runs again from what is cached
    again = toks(9) + [40, 41]
    assert kv.match_prefix("a", again, len(again) - 1) == 10
    assert len(mem.copies) == 1


def test_tails_are_listed_for_the_disk_after_their_blocks_under_their_own_hash():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    Memory(kv)
    run(kv, "a", toks(10))
    kv.free("a")
    listed = kv.cached_blocks()
    assert [b.token_ids for b in listed] == [tuple(toks(4)), tuple(toks(4, 4)), (8, 9)]
    assert listed[2].parent == listed[1].block_hash == hash_block(listed[0].block_hash, toks(4, 4))
    assert listed[2].block_hash == hash_block(listed[1].block_hash, (8, 9))
    run(kv, "b", [99] * 6)  # a tail of its own first block: parent None
    kv.free("b")
    assert [b.token_ids for b in kv.cached_blocks()][:2] == [(99,) * 4, (99, 99)]  # the most recent chain first
    assert kv.reset_prefix_cache() == 5 and not kv.tails and len(kv.children) == 0


def test_a_tail_whose_chain_lost_a_block_is_not_listed():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    Memory(kv)
    run(kv, "a", toks(10))
    kv.free("a")
    kv._evict(kv.hash_to_block[kv.cached_blocks()[0].block_hash])  # the chain's first block goes
    assert kv.cached_blocks() == []


class TailSource:
    """A block source holding tails only (an earlier run's file), filling a block with the tail's label."""

    def __init__(self, mem, tails):
        self.mem, self.tails, self.filled = mem, tails, []  # tails: {parent: [(tokens, key)]}

    def __contains__(self, h):
        return False

    def longest_tail(self, parent, token_ids):
        shared = [(common_prefix(t, token_ids), t, k) for t, k in self.tails.get(parent, [])]
        n, t, k = max(shared, default=(0, (), b""))
        return (t, k) if n else None

    def fill(self, key, block_id):
        self.filled.append(key)
        self.mem.contents[block_id] = f"disk {key.decode()}"
        return key != b"bad"


def test_a_tail_on_disk_is_hit_when_it_shares_more_than_the_cached_children():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    mem = Memory(kv)
    run(kv, "a", toks(5))  # block 0 hashed; tail (4,) kept
    kv.free("a")
    parent = kv.cached_blocks()[0].block_hash
    kv.block_source = TailSource(mem, {parent: [((4, 5, 6), b"k1"), ((4, 9), b"k2")]})
    q = toks(7) + [60]
    assert kv.match_prefix("b", q, len(q) - 1) == 7  # 4 + the disk tail's 3 (memory's tail had 1)
    assert kv.block_source.filled == [b"k1"] and mem.contents[kv.block_table("b")[1]] == "disk k1"
    assert kv.source_hits == 3 and len(kv.tails) == 2  # the filled tail stays cached
    kv.free("b")
    kv.block_source.filled.clear()
    assert kv.match_prefix("c", toks(6) + [61], 6) == 6  # memory now shares as much: no read
    assert kv.block_source.filled == []


def test_a_tail_that_fails_to_read_is_not_used():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    mem = Memory(kv)
    run(kv, "a", toks(4))
    kv.free("a")
    parent = kv.cached_blocks()[0].block_hash
    kv.block_source = TailSource(mem, {parent: [((4, 5), b"bad")]})
    assert kv.match_prefix("b", toks(7), 6) == 4 and kv.source_hits == 0 and not kv.tails
    assert kv.stats().num_free == 7  # only b's hit block is taken


def test_insert_cached_takes_a_tail_after_its_parent_and_only_where_blocks_can_be_copied():
    toks8 = toks(8)
    for copies in (True, False):
        kv = KVCacheManager(num_blocks=4, block_size=BS)
        if copies:
            Memory(kv)
        h0 = hash_block(None, toks8[:4])
        tail = hash_block(h0, (4, 5))
        assert not kv.insert_cached(tail, h0, (4, 5), lambda b: True)  # its parent is not cached
        assert kv.insert_cached(h0, None, toks8[:4], lambda b: True)
        assert kv.insert_cached(tail, h0, (4, 5), lambda b: True) == copies
        assert kv.match_prefix("s", toks8, 7) == (6 if copies else 4)
