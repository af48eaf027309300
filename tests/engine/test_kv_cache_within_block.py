"""Prefix hits within a block (kv_cache.py): a prompt whose chain of whole cached blocks ends mid-block copies the
cached block that starts with the most of its next tokens. The copies here move labels in a dict standing for the
engine's KV memory, so each test can say which block's contents a sequence ended up with; the engine's own copy is
tested with real K/V in test_prefix_within_block.py."""

from inferd.engine.kv_cache import KVCacheManager

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


def test_tails_are_not_written_to_disk():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    Memory(kv)
    run(kv, "a", toks(10))
    kv.free("a")
    assert [b.token_ids for b in kv.cached_blocks()] == [tuple(toks(4)), tuple(toks(4, 4))]
    assert kv.reset_prefix_cache() == 3 and not kv.tails and len(kv.children) == 0
