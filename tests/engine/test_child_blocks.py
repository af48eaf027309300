import random

import pytest

from inferd.engine.child_blocks import ChildBlocks, common_prefix


def brute_longest(entries, parent, query):
    best = (-1, 0)
    for p, tokens, block_id in entries:
        n = common_prefix(tokens, query)
        if p == parent and n > best[1]:
            best = (block_id, n)
    return best[1]


def test_longest_matches_a_scan_of_every_child():
    rng = random.Random(3)
    index, entries = ChildBlocks(), []
    for block_id in range(400):
        parent = rng.choice([None, b"a", b"b"])
        tokens = tuple(rng.randrange(4) for _ in range(rng.randrange(1, 9)))
        index.add(parent, tokens, block_id)
        entries.append((parent, tokens, block_id))
    for _ in range(2000):
        parent = rng.choice([None, b"a", b"b", b"c"])
        query = [rng.randrange(4) for _ in range(rng.randrange(1, 9))]
        block_id, n = index.longest(parent, query)
        assert n == brute_longest(entries, parent, query)
        if n:
            found_parent, tokens = next((p, t) for p, t, b in entries if b == block_id)
            assert found_parent == parent and tokens[:n] == tuple(query[:n])
        else:
            assert block_id == -1


def test_remove_takes_out_only_that_block():
    index = ChildBlocks()
    index.add(b"p", (1, 2, 3), 7)
    index.add(b"p", (1, 2, 3), 8)  # the same tokens in two blocks (two sequences' tails)
    index.add(None, (1, 2), 9)
    assert len(index) == 3
    index.remove(b"p", (1, 2, 3), 7)
    assert index.longest(b"p", [1, 2, 3, 4]) == (8, 3)
    index.remove(b"p", (1, 2, 3), 8)
    assert index.longest(b"p", [1, 2, 3]) == (-1, 0)
    assert index.longest(None, [1, 5]) == (9, 1)
    with pytest.raises(KeyError, match="block 9 is not a child"):
        index.remove(b"p", (1, 2), 9)
    with pytest.raises(KeyError):
        index.remove(None, (1, 2), 10)
    assert len(index) == 1


def test_no_shared_first_token_is_no_hit():
    index = ChildBlocks()
    index.add(None, (5, 6), 1)
    assert index.longest(None, [6, 5]) == (-1, 0)
    assert index.longest(None, []) == (-1, 0)
