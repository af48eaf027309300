import pytest

from inferd.engine.kv_cache import KVCacheManager, NoFreeBlocks, hash_block

BS = 4  # small blocks keep the arithmetic readable; the manager does not care about the size


def toks(n, start=0):
    return list(range(start, start + n))


def test_allocate_covers_positions_and_free_returns_blocks():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    kv.allocate("a", 9)  # positions 0..8 -> 3 blocks
    assert kv.block_table("a") == [0, 1, 2]
    kv.allocate("a", 12)  # still 3 blocks
    assert len(kv.block_table("a")) == 3
    kv.allocate("a", 13)
    assert kv.block_table("a") == [0, 1, 2, 3]
    s = kv.stats()
    assert (s.num_used, s.num_free, s.num_cached) == (4, 4, 0)
    assert s.usage == 0.5
    kv.free("a")
    s = kv.stats()
    assert (s.num_used, s.num_free) == (0, 8)
    assert not kv.has_seq("a")
    kv.free("a")  # idempotent: aborts may race with finishing


def test_allocation_is_all_or_nothing():
    kv = KVCacheManager(num_blocks=3, block_size=BS)
    kv.allocate("a", 8)
    assert not kv.can_allocate("b", 9)
    with pytest.raises(NoFreeBlocks, match="need 3 blocks, 1 free"):
        kv.allocate("b", 9)
    assert kv.stats().num_free == 1
    assert kv.block_table("b") == []
    assert kv.can_allocate("b", 4)


def test_prefix_hit_shares_blocks_and_counts_tokens():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    prompt = toks(10)
    assert kv.match_prefix("a", prompt, len(prompt) - 1) == 0
    kv.allocate("a", 10)
    kv.cache_blocks("a", prompt, 10)  # blocks 0 and 1 are full, block 2 half
    assert kv.stats().num_cached == 2

    other = toks(8) + [99, 98, 97]
    assert kv.match_prefix("b", other, len(other) - 1) == 8
    assert kv.block_table("b") == kv.block_table("a")[:2]
    assert kv.ref_counts[kv.block_table("a")[0]] == 2
    s = kv.stats()
    assert (s.prefix_queries, s.prefix_hits) == (21, 8)


def test_hit_is_capped_so_at_least_one_token_runs():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    prompt = toks(8)
    kv.match_prefix("a", prompt, 7)
    kv.allocate("a", 8)
    kv.cache_blocks("a", prompt, 8)
    kv.free("a")
    # the whole prompt is cached, but the last block must be recomputed to sample from its last token
    assert kv.match_prefix("b", prompt, 7) == 4
    kv.allocate("b", 8)
    kv.cache_blocks("b", prompt, 8)  # its copy of block 1 duplicates the cached one: not registered twice
    assert kv.stats().num_cached == 2
    kv.free("b")
    assert kv.stats().num_free == 8


def test_different_parent_does_not_hit():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 0]
    kv.match_prefix("a", a, 8)
    kv.allocate("a", 9)
    kv.cache_blocks("a", a, 9)
    b = [9, 9, 9, 9, 5, 6, 7, 8, 0]  # second block equal, first not: the chain breaks at block 0
    assert kv.match_prefix("b", b, 8) == 0
    assert hash_block(None, a[:4]) != hash_block(hash_block(None, b[:4]), a[4:8])


def test_freed_cached_blocks_survive_until_evicted_lru():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    for name, start in (("a", 0), ("b", 100)):
        p = toks(4, start) + [0]
        kv.match_prefix(name, p, 4)
        kv.allocate(name, 5)
        kv.cache_blocks(name, p, 5)
    kv.free("a")  # a's full block is cached and unreferenced, a's partial block is plain free
    kv.free("b")
    s = kv.stats()
    assert (s.num_free, s.num_cached, s.num_cached_free) == (4, 2, 2)

    # plain free blocks are used before any cached one is evicted
    kv.allocate("c", 8)
    assert kv.stats().num_cached == 2
    # the next allocation evicts the least recently freed cached block: a's
    kv.allocate("d", 4)
    assert kv.match_prefix("e", toks(4) + [0], 4) == 0
    assert kv.match_prefix("f", toks(4, 100) + [0], 4) == 4
    assert kv.stats().num_cached == 1


def test_hit_on_free_cached_block_removes_it_from_free_queue():
    kv = KVCacheManager(num_blocks=2, block_size=BS)
    p = toks(4) + [7]
    kv.match_prefix("a", p, 4)
    kv.allocate("a", 5)
    kv.cache_blocks("a", p, 5)
    kv.free("a")
    assert kv.match_prefix("b", p, 4) == 4
    assert kv.stats().num_free == 1
    kv.allocate("b", 5)
    assert kv.stats().num_free == 0
    with pytest.raises(NoFreeBlocks):
        kv.allocate("c", 1)  # the hit block is referenced again: never evicted from under "b"


def test_generated_tokens_get_cached_too():
    kv = KVCacheManager(num_blocks=8, block_size=BS)
    seq = toks(3)
    kv.match_prefix("a", seq, 2)
    kv.allocate("a", 3)
    kv.cache_blocks("a", seq, 3)
    for t in (50, 51, 52):  # decode: each step computes the previous token's K/V
        seq.append(t)
        kv.allocate("a", len(seq))
        kv.cache_blocks("a", seq, len(seq) - 1)
    assert kv.stats().num_cached == 1
    kv.free("a")
    assert kv.match_prefix("b", [0, 1, 2, 50, 60], 4) == 4


def test_prefix_caching_disabled():
    kv = KVCacheManager(num_blocks=4, block_size=BS, enable_prefix_caching=False)
    p = toks(9)
    kv.match_prefix("a", p, 8)
    kv.allocate("a", 9)
    kv.cache_blocks("a", p, 9)
    kv.free("a")
    assert kv.match_prefix("b", p, 8) == 0
    assert kv.stats().num_cached == 0


def test_reset_prefix_cache():
    kv = KVCacheManager(num_blocks=4, block_size=BS)
    p = toks(8) + [1]
    kv.match_prefix("a", p, 8)
    kv.allocate("a", 9)
    kv.cache_blocks("a", p, 9)
    kv.free("a")
    assert kv.reset_prefix_cache() == 2
    assert kv.stats().num_cached == 0
    assert kv.match_prefix("b", p, 8) == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_blocks must be positive"):
        KVCacheManager(0)
    kv = KVCacheManager(2, block_size=BS)
    kv.match_prefix("a", [1], 0)
    with pytest.raises(ValueError, match="already has blocks"):
        kv.match_prefix("a", [1], 0)
