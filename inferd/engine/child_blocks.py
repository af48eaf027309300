"""Cached KV blocks by their parent's hash, each parent's children sorted by token ids: the child that starts with the
most tokens of a query, found by bisection.

The prefix cache (kv_cache.py) hits whole blocks by hash. Where a prompt leaves that chain in the middle of a block
(a follow-up question after a long system prompt, the next turn of a conversation), the block another sequence
computed there usually starts the same way: the positions both share are copied instead of recomputed. In a list of
token sequences sorted lexicographically, the longest common prefix with a query is that of one of the query's two
neighbours, so a lookup costs a bisection and two comparisons however many children a parent has.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence

Tokens = tuple[int, ...]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ChildBlocks:
    def __init__(self) -> None:
        self._children: dict[bytes | None, list[tuple[Tokens, int]]] = {}

    def __len__(self) -> int:
        return sum(len(c) for c in self._children.values())

    def add(self, parent: bytes | None, token_ids: Tokens, block_id: int) -> None:
        insort(self._children.setdefault(parent, []), (token_ids, block_id))

    def remove(self, parent: bytes | None, token_ids: Tokens, block_id: int) -> None:
        children = self._children.get(parent)
        entry = (token_ids, block_id)
        i = bisect_left(children, entry) if children else 0
        if not children or i == len(children) or children[i] != entry:
            raise KeyError(f"block {block_id} is not a child of that parent")
        del children[i]
        if not children:
            del self._children[parent]

    def longest(self, parent: bytes | None, token_ids: Sequence[int]) -> tuple[int, int]:
        """(block id, n): the child of `parent` whose token ids share the longest prefix with `token_ids`, n tokens of
        it (0 and block id -1 when no child shares its first token)."""
        children = self._children.get(parent)
        if not children:
            return -1, 0
        query = tuple(token_ids)
        i = bisect_left(children, (query,))
        best = (-1, 0)
        for tokens, block_id in children[max(0, i - 1) : i + 1]:
            n = common_prefix(tokens, query)
            if n > best[1]:
                best = (block_id, n)
        return best
