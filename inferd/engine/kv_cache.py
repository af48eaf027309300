"""Paged KV-cache bookkeeping: which block holds which positions of which sequence.

The engine owns the KV memory itself (``num_kv_blocks`` blocks of ``block_size`` positions per layer); this
module only decides which block ids each sequence uses. It runs in the scheduler thread and is not
thread-safe on purpose: one owner, no locks.

Automatic prefix caching: once every position of a block has been computed, the block is registered under a
hash of (parent block's hash, the block's token ids). A later sequence whose token ids start the same way
finds the chain of hashes in ``hash_to_block`` and reuses those blocks instead of recomputing them. Blocks
are refcounted; a block whose refcount drops to zero keeps its contents and its hash and waits in an LRU
queue, so it can still be hit until the space is needed for something else (eviction).

Each cached block also keeps its parent's hash, its token ids and when it was last hit, so that the blocks worth
keeping can be written to disk (inferd/engine/prompt_cache_disk.py); a `block_source` (the file written by an
earlier run) is asked for a hash the cache lacks, and the block it fills counts as a hit like any other.

Within a block: given a `copy_block` (an engine that can copy one KV block to another), a prompt whose chain of whole
blocks ends where it differs from every cached one mid-block takes the cached child of its last hit block that
starts with the most of its next tokens (child_blocks.py), copied into a block of its own, and those tokens count as
computed. A finished sequence's last, partly filled block is kept as such a child too (a "tail": cached, unreferenced,
evicted like the others, not in the hash chain), so the next turn of a conversation recomputes only what is new.
Positions past the shared ones hold the other sequence's K/V until overwritten: attention never reads a position past
a sequence's length. Tails are saved to disk beside the blocks, keyed by hash_block(parent, their tokens), and a block
source offers the tail of a parent that starts with the most of a prompt's next tokens (longest_tail) to the same
lookup.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from collections.abc import Callable, Sequence
from typing import Protocol

from inferd.engine.child_blocks import ChildBlocks, common_prefix


BROKEN = -2  # cached_blocks' depth of a block whose chain has lost a link


class NoFreeBlocks(Exception):
    """Raised when an allocation needs more blocks than are free; the caller preempts and retries."""


@dataclass
class KVStats:
    num_blocks: int
    num_used: int  # referenced by at least one live sequence
    num_free: int  # allocatable now (never used, or cached but unreferenced)
    num_cached: int  # holding a registered prefix hash (used or not)
    num_cached_free: int  # cached and unreferenced: hits still possible, evicted first-in first-out
    prefix_queries: int  # prompt tokens looked up in the prefix cache since start
    prefix_hits: int  # of which found cached
    source_hits: int = 0  # of which filled by the block source (read from disk)
    num_state_slots: int = 0  # recurrent-state slots (a model with recurrent layers), one per running sequence
    num_state_slots_used: int = 0
    num_state_snapshots: int = 0  # recurrent states kept at cached block boundaries (prefix caching of a hybrid)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks if self.num_blocks else 0.0


@dataclass
class _SeqBlocks:
    block_table: list[int] = field(default_factory=list)
    # hashes of the sequence's first len(block_hashes) full blocks, all registered in the cache (or already
    # present there under the same hash, computed by someone else)
    block_hashes: list[bytes] = field(default_factory=list)
    root: bytes | None = None  # the parent of the first block's hash (a LoRA adapter's K/V hash apart)
    state_slot: int = -1  # its recurrent-state slot, taken at its first step (a model with recurrent layers)
    restore: object = None  # the state snapshot a prefix hit starts it from, until the engine takes it
    # the sequence's tokens, of which the first num_computed have their K/V written, as the last match_prefix or
    # cache_blocks was told: what free() keeps of its last, partly filled block (a tail)
    token_ids: Sequence[int] = ()
    num_computed: int = 0


class BlockSource(Protocol):
    """Prefix blocks computed elsewhere (an earlier run's file), by hash; and tails, by their parent's hash."""

    def __contains__(self, block_hash: bytes) -> bool: ...

    def longest_tail(self, parent: bytes | None, token_ids: Sequence[int]) -> tuple[tuple[int, ...], bytes] | None:
        """(its token ids, its key) of the tail of `parent` the source holds that starts with the most of
        `token_ids` (None if none shares the first); fill(key, ...) writes it."""
        ...

    def fill(self, block_hash: bytes, block_id: int) -> bool:
        """Write the block's K/V into KV block `block_id`; False (nothing usable written) if it cannot."""
        ...


@dataclass(frozen=True)
class CachedBlock:
    block_hash: bytes  # a tail's (fewer token ids than a block holds): hash_block(parent, its token ids)
    parent: bytes | None
    token_ids: tuple[int, ...]
    block_id: int
    last_hit: int  # a tick of the manager's clock: larger is more recent


def hash_block(parent: bytes | None, token_ids: Sequence[int]) -> bytes:
    # A strong hash rather than Python's hash(): a collision would silently hand one user's KV to another
    # prompt, so it must be practically impossible, and block ids cannot stand in for the parent because
    # they are reused after eviction.
    h = hashlib.blake2b(parent or b"root", digest_size=16)
    h.update(b"".join(t.to_bytes(4, "little") for t in token_ids))
    return h.digest()


class KVCacheManager:
    def __init__(
        self, num_blocks: int, block_size: int = 64, enable_prefix_caching: bool = True, num_state_slots: int = 0
    ):
        """num_state_slots: a model with recurrent layers keeps each running sequence's state in a slot of its
        own, held from the sequence's first step until it is freed (finished, aborted or preempted: a preempted
        sequence recomputes its state from position 0 when it runs again). With prefix caching, such a model's
        cached prefix is usable only up to a block whose end has a state snapshot (store_snapshot): at most
        num_state_slots snapshots are kept, the least recently stored or hit dropped first, and a snapshot goes with
        its block when that is evicted."""
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        # Free blocks that never held a registered prefix are handed out first, so cached prefixes survive
        # as long as possible; cached free blocks are evicted least recently freed first.
        self._free_plain: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._seqs: dict[object, _SeqBlocks] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0
        # what a cached block needs to be saved and found again: its parent's hash, its token ids, its last hit
        self.block_parent: list[bytes | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...]] = [()] * num_blocks
        self.block_last_hit = [0] * num_blocks
        self._tick = 0
        self.block_source: BlockSource | None = None
        self.source_hits = 0  # of prefix_hits, tokens whose blocks the block_source filled
        self.num_state_slots = num_state_slots
        self._free_slots: deque[int] = deque(range(num_state_slots))
        self.snapshots: OrderedDict[bytes, object] = OrderedDict()  # block hash -> the state at the block's end
        self.max_snapshots = num_state_slots
        # copy_block(src, dst): one KV block's contents into another; set by an engine that can, it turns on hits
        # within a block (never for a model with recurrent layers: its state exists only at snapshot boundaries)
        self.copy_block: Callable[[int, int], None] | None = None
        self.children = ChildBlocks()  # every cached block, and every tail, under its parent's hash
        self.tails: set[int] = set()  # cached blocks that are a finished sequence's partly filled last block

    # ---- queries -------------------------------------------------------------------------------------

    @property
    def hits_within_block(self) -> bool:
        """Whether a prefix hit may end inside a block (see the module's docstring)."""
        return self.enable_prefix_caching and self.copy_block is not None and not self.num_state_slots

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_plain) + len(self._free_cached)

    def blocks_needed(self, num_positions: int) -> int:
        return -(-num_positions // self.block_size)

    def block_table(self, seq_id: object) -> list[int]:
        return self._seqs[seq_id].block_table

    def state_slot(self, seq_id: object) -> int:
        """`seq_id`'s recurrent-state slot, taken from the free ones at its first call (-1 without slots)."""
        seq = self._seqs[seq_id]
        if seq.state_slot < 0 and self.num_state_slots:
            if not self._free_slots:
                raise NoFreeBlocks(f"all {self.num_state_slots} recurrent-state slots are in use")
            seq.state_slot = self._free_slots.popleft()
        return seq.state_slot

    def has_seq(self, seq_id: object) -> bool:
        return seq_id in self._seqs

    def stats(self) -> KVStats:
        num_free = self.num_free_blocks
        return KVStats(
            num_blocks=self.num_blocks,
            num_used=self.num_blocks - num_free,
            num_free=num_free,
            num_cached=len(self.hash_to_block),
            num_cached_free=len(self._free_cached),
            prefix_queries=self.prefix_queries,
            prefix_hits=self.prefix_hits,
            source_hits=self.source_hits,
            num_state_slots=self.num_state_slots,
            num_state_slots_used=self.num_state_slots - len(self._free_slots),
            num_state_snapshots=len(self.snapshots),
        )

    # ---- recurrent-state snapshots (a hybrid model's prefix caching) ------------------------------------

    def store_snapshot(self, seq_id: object, num_computed: int, state: object) -> None:
        """Keep `state`, `seq_id`'s recurrent state after its first num_computed positions (a block boundary), for
        the cached block that ends there."""
        seq = self._seqs.get(seq_id)
        i = num_computed // self.block_size - 1
        if (
            seq is None
            or num_computed % self.block_size
            or not 0 <= i < len(seq.block_hashes)
            or not self.max_snapshots
        ):
            return
        h = seq.block_hashes[i]
        if self.hash_to_block.get(h) is None:
            return
        self.snapshots[h] = state
        self.snapshots.move_to_end(h)
        while len(self.snapshots) > self.max_snapshots:
            self.snapshots.popitem(last=False)

    def take_restore(self, seq_id: object) -> object:
        """The snapshot a prefix hit starts `seq_id` from (once), or None."""
        seq = self._seqs[seq_id]
        restore, seq.restore = seq.restore, None
        return restore

    # ---- sequence lifecycle --------------------------------------------------------------------------

    def match_prefix(
        self, seq_id: object, token_ids: Sequence[int], max_cached_tokens: int, root: bytes | None = None
    ) -> int:
        """Start `seq_id`'s block table with the cached blocks of the longest cached prefix of `token_ids`.

        Returns the number of positions already computed (at most max_cached_tokens; a multiple of block_size
        unless a hit within a block follows the whole ones). Callers pass len(prompt) - 1 as the cap so that at
        least one token is run and its logits sampled. The hit blocks are referenced by the sequence from now on.
        `root`: the parent of the first block's hash, for sequences whose K/V differ for the same tokens (a LoRA
        adapter's); None for the base model's.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already has blocks")
        seq = _SeqBlocks(root=root, token_ids=token_ids)
        self._seqs[seq_id] = seq
        self.prefix_queries += len(token_ids)
        if not self.enable_prefix_caching:
            return 0
        parent = root
        bs = self.block_size
        limit = min(len(token_ids), max_cached_tokens)
        self._tick += 1
        for i in range(limit // bs):
            chunk = token_ids[i * bs : (i + 1) * bs]
            h = hash_block(parent, chunk)
            block_id = self.hash_to_block.get(h)
            if block_id is not None:
                self._ref(block_id)
            else:
                block_id = self._fill_from_source(h, parent, chunk)
                if block_id is None:
                    break
                self.source_hits += bs
            self.block_last_hit[block_id] = self._tick
            seq.block_table.append(block_id)
            seq.block_hashes.append(h)
            parent = h
        if self.num_state_slots:  # a hybrid: the prefix ends at the deepest block with the state at its end
            depth = max((i + 1 for i, h in enumerate(seq.block_hashes) if h in self.snapshots), default=0)
            for block_id in reversed(seq.block_table[depth:]):
                self._unref(block_id)
            del seq.block_table[depth:], seq.block_hashes[depth:]
            if depth:
                seq.restore = self.snapshots[seq.block_hashes[-1]]
                self.snapshots.move_to_end(seq.block_hashes[-1])
        num_cached = len(seq.block_table) * bs
        if self.hits_within_block:
            rest = token_ids[num_cached : min(limit, num_cached + bs)]
            from_source = self._fill_tail_from_source(parent, rest)
            n = self._copy_within_block(seq, parent, rest)
            num_cached += n
            self.source_hits += n if from_source else 0
        seq.num_computed = num_cached
        self.prefix_hits += num_cached
        return num_cached

    def _fill_tail_from_source(self, parent: bytes | None, token_ids: Sequence[int]) -> bool:
        """Cache the block source's tail of `parent` that starts with the most of `token_ids`, when it starts with
        more of them than every cached child does; True if one was filled."""
        source = self.block_source
        if source is None or not token_ids or not self.num_free_blocks:
            return False
        found = source.longest_tail(parent, token_ids)
        if found is None or common_prefix(found[0], token_ids) <= self.children.longest(parent, token_ids)[1]:
            return False
        tail, key = found
        return self.insert_cached(key, parent, tail, lambda block_id: source.fill(key, block_id))

    def _add_tail(self, parent: bytes | None, tail: tuple[int, ...], block_id: int) -> None:
        self.children.add(parent, tail, block_id)
        self.tails.add(block_id)
        self.block_parent[block_id] = parent
        self.block_tokens[block_id] = tail
        self._touch(block_id)

    def _touch(self, block_id: int) -> None:
        """Make `block_id` the most recently hit block."""
        self._tick += 1
        self.block_last_hit[block_id] = self._tick

    def _tail_cached(self, parent: bytes | None, tail: Sequence[int]) -> bool:
        """Whether a cached child of `parent` already starts with all of `tail`."""
        return self.children.longest(parent, tail)[1] == len(tail)

    def _copy_within_block(self, seq: _SeqBlocks, parent: bytes | None, token_ids: Sequence[int]) -> int:
        """Append to `seq` a copy of the cached child of `parent` that starts with the most of `token_ids` (its
        next block's worth at most); returns how many of them it shares (0: nothing copied)."""
        src, n = self.children.longest(parent, token_ids)
        if not n:
            return 0
        self._ref(src)  # the block taken next must not be src itself, evicted
        if not self.num_free_blocks:
            self._unref(src)
            return 0
        dst = self._take_free_block()
        assert self.copy_block is not None
        self.copy_block(src, dst)
        self.block_last_hit[src] = self._tick
        self._unref(src)
        seq.block_table.append(dst)
        return n

    def allocate(self, seq_id: object, num_positions: int) -> None:
        """Grow `seq_id`'s block table to cover positions [0, num_positions).

        All or nothing: raises NoFreeBlocks without allocating anything when there are too few free blocks.
        """
        seq = self._seqs.get(seq_id)
        if seq is None:
            seq = self._seqs[seq_id] = _SeqBlocks()
        missing = self.blocks_needed(num_positions) - len(seq.block_table)
        if missing <= 0:
            return
        if missing > self.num_free_blocks:
            raise NoFreeBlocks(f"need {missing} blocks, {self.num_free_blocks} free")
        for _ in range(missing):
            seq.block_table.append(self._take_free_block())

    def can_allocate(self, seq_id: object, num_positions: int) -> bool:
        seq = self._seqs.get(seq_id)
        have = len(seq.block_table) if seq else 0
        return self.blocks_needed(num_positions) - have <= self.num_free_blocks

    def cache_blocks(self, seq_id: object, token_ids: Sequence[int], num_computed: int) -> None:
        """Register every block of `seq_id` that is now full of computed positions.

        `token_ids` are the sequence's tokens so far (prompt + generated); `num_computed` is how many of
        them have their K/V written. Call after each step.
        """
        if not self.enable_prefix_caching:
            return
        seq = self._seqs[seq_id]
        seq.token_ids, seq.num_computed = token_ids, num_computed
        bs = self.block_size
        num_full = min(num_computed, len(token_ids)) // bs
        parent = seq.block_hashes[-1] if seq.block_hashes else seq.root
        for i in range(len(seq.block_hashes), num_full):
            h = hash_block(parent, token_ids[i * bs : (i + 1) * bs])
            block_id = seq.block_table[i]
            if h not in self.hash_to_block:
                self._register(block_id, h, parent, token_ids[i * bs : (i + 1) * bs])
            # else: another sequence computed the same block concurrently; that copy stays the cached one
            # and ours is returned to the plain free list when this sequence ends.
            seq.block_hashes.append(h)
            parent = h

    def free(self, seq_id: object) -> None:
        """Drop `seq_id`'s references (finished, aborted or preempted). Unknown ids are ignored."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return
        if seq.state_slot >= 0:
            self._free_slots.append(seq.state_slot)
        self._keep_tail(seq)
        # Reverse order: a sequence's tail blocks are the least likely to be shared, so they should be the
        # first cached blocks to be evicted.
        for block_id in reversed(seq.block_table):
            self._unref(block_id)

    def _keep_tail(self, seq: _SeqBlocks) -> None:
        """Make `seq`'s partly computed last block a tail (see the module's docstring), unless a cached block
        already starts with all of its tokens or nothing could copy it."""
        if not self.hits_within_block:
            return
        i = len(seq.block_hashes)
        tail = tuple(seq.token_ids[i * self.block_size : seq.num_computed])
        if not tail or i >= len(seq.block_table):
            return
        block_id = seq.block_table[i]
        parent = seq.block_hashes[-1] if seq.block_hashes else seq.root
        if self.ref_counts[block_id] != 1 or self._tail_cached(parent, tail):
            return
        self._add_tail(parent, tail, block_id)

    def _unref(self, block_id: int) -> None:
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            if self.block_hash[block_id] is not None or block_id in self.tails:
                self._free_cached[block_id] = None
            else:
                self._free_plain.append(block_id)

    def cached_blocks(self) -> list[CachedBlock]:
        """Every cached block and tail whose whole chain back to the first block is cached, most recently hit first
        and each after its parent (so any prefix of the list is a set of usable chains)."""
        tick: dict[bytes, int] = {}
        depth: dict[bytes, int] = {}
        nodes = list(self.hash_to_block.items())
        tails = {hash_block(self.block_parent[b], self.block_tokens[b]): b for b in self.tails}
        for h, block_id in nodes + list(tails.items()):
            # a parent is worth at least what its most recently hit descendant is worth
            t = self.block_last_hit[block_id]
            tick[h] = max(tick.get(h, -1), t)
            node = self.block_parent[block_id]
            while node is not None and node in self.hash_to_block and tick.get(node, -1) < t:
                tick[node] = t
                node = self.block_parent[self.hash_to_block[node]]

        def depth_of(h: bytes) -> int:  # BROKEN: an ancestor is no longer cached, so the chain cannot be hit
            path: list[bytes] = []
            node = h
            while True:
                if node in depth:
                    base = depth[node]
                    break
                block_id = self.hash_to_block.get(node)
                if block_id is None:
                    base = BROKEN
                    break
                path.append(node)
                up = self.block_parent[block_id]
                if up is None:
                    base = -1
                    break
                node = up
            for n in reversed(path):
                base = BROKEN if base == BROKEN else base + 1
                depth[n] = base
            return depth[h]

        out = []
        for h, block_id in nodes:
            d = depth_of(h)
            if d >= 0:
                out.append((-tick[h], d, h, block_id))
        for h, block_id in tails.items():  # a tail: one deeper than its parent, whose chain must be whole
            up = self.block_parent[block_id]
            d = -1 if up is None else depth_of(up) if up in self.hash_to_block else BROKEN
            if d != BROKEN:
                out.append((-tick[h], d + 1, h, block_id))
        out.sort(key=lambda r: (r[0], r[1]))
        return [CachedBlock(h, self.block_parent[b], self.block_tokens[b], b, -t) for t, _d, h, b in out]

    def insert_cached(
        self, block_hash: bytes, parent: bytes | None, token_ids: Sequence[int], fill: Callable[[int], bool]
    ) -> bool:
        """Add a block computed elsewhere (a saved conversation) to the cache, unreferenced, as the most recently
        freed. `fill(block_id)` writes its K/V and says whether it could. True if the block is cached now. Fewer
        token ids than block_size make a tail, cached only where hits within a block are."""
        if not self.enable_prefix_caching:
            return False
        tail = len(token_ids) < self.block_size
        if self._tail_cached(parent, token_ids) if tail else block_hash in self.hash_to_block:
            return True
        if (
            (tail and not self.hits_within_block)
            or (parent is not None and parent not in self.hash_to_block)
            or not self.num_free_blocks
        ):
            return False
        block_id = self._filled_block(fill)
        if block_id is None:
            return False
        if tail:
            self._add_tail(parent, tuple(token_ids), block_id)
        else:
            self._register(block_id, block_hash, parent, token_ids)
            self._touch(block_id)
        self.ref_counts[block_id] = 0
        self._free_cached[block_id] = None
        return True

    def reset_prefix_cache(self) -> int:
        """Forget every unreferenced cached block; returns how many were dropped."""
        dropped = 0
        while self._free_cached:
            block_id, _ = self._free_cached.popitem(last=False)
            self._evict(block_id)
            self._free_plain.append(block_id)
            dropped += 1
        return dropped

    # ---- internals -----------------------------------------------------------------------------------

    def _ref(self, block_id: int) -> None:
        if self.ref_counts[block_id] == 0:
            self._free_cached.pop(block_id, None)
        self.ref_counts[block_id] += 1

    def _register(self, block_id: int, h: bytes, parent: bytes | None, token_ids: Sequence[int]) -> None:
        self.hash_to_block[h] = block_id
        self.block_hash[block_id] = h
        self.block_parent[block_id] = parent
        self.block_tokens[block_id] = tuple(token_ids)
        self.children.add(parent, self.block_tokens[block_id], block_id)
        self.block_last_hit[block_id] = self._tick

    def _fill_from_source(self, h: bytes, parent: bytes | None, token_ids: Sequence[int]) -> int | None:
        """A free block filled by the block source and registered under `h`, referenced once; None if the source
        lacks it, fails, or no block is free."""
        source = self.block_source
        if source is None or not self.num_free_blocks or h not in source:
            return None
        block_id = self._filled_block(lambda b: source.fill(h, b))
        if block_id is not None:
            self._register(block_id, h, parent, token_ids)
        return block_id

    def _filled_block(self, fill: Callable[[int], bool]) -> int | None:
        """A free block written by `fill`, referenced once; None, the block free again, when `fill` fails."""
        block_id = self._take_free_block()
        if fill(block_id):
            return block_id
        self.ref_counts[block_id] = 0
        self._free_plain.append(block_id)
        return None

    def _take_free_block(self) -> int:
        if self._free_plain:
            block_id = self._free_plain.popleft()
        else:
            block_id, _ = self._free_cached.popitem(last=False)
            self._evict(block_id)
        self.ref_counts[block_id] = 1
        return block_id

    def _evict(self, block_id: int) -> None:
        h = self.block_hash[block_id]
        if h is None and block_id not in self.tails:
            return
        self.children.remove(self.block_parent[block_id], self.block_tokens[block_id], block_id)
        self.tails.discard(block_id)
        if h is not None:
            self.snapshots.pop(h, None)
            self.block_hash[block_id] = None
            if self.hash_to_block.get(h) == block_id:
                del self.hash_to_block[h]
        self.block_parent[block_id] = None
        self.block_tokens[block_id] = ()
