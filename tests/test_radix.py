"""Radix prefix tree: insert / match / split / lock / LRU eviction, with and without the host tier.

Pages hold real data: page ``p`` of the (bf16) pool stores, for each of its slots, the token id and
its position, so after every operation :func:`check` verifies the tree's structural invariants *and*
that every node's device pages and host slots hold exactly the tokens of its key.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch

from nibblekv.cache import KVPool, size_pool
from nibblekv.cache.hiradix import HiRadixCache
from nibblekv.cache.host_tier import HostTier
from nibblekv.cache.radix import RadixCache, TreeNode
from nibblekv.formats import KVDtype

P = 4


def make_pool(num_pages: int = 32, layers: int = 2) -> KVPool:
    spec = size_pool(
        num_layers=layers, num_kv_heads=1, head_dim=16, page_size=P, kv_dtype=KVDtype.BF16,
        model_kv_dtype=KVDtype.BF16, recent_window=0, max_running_requests=4, budget_bytes=None,
        max_total_tokens=num_pages * P,
    )  # fmt: skip
    return KVPool(spec, "cpu", torch.ones(layers, 2))


def make_tree(pool: KVPool) -> RadixCache:
    return RadixCache(P, pool.main_alloc)


def make_hi(pool: KVPool, host_pages: int, policy: str = "write_back") -> HiRadixCache:
    return HiRadixCache(P, pool.main_alloc, HostTier(pool, host_pages), policy)


def store(pool: KVPool, tokens: Sequence[int], start: int = 0) -> list[int]:
    """Allocate pages for ``tokens`` (whole pages) and write each slot's (token, position, layer)."""
    n = len(tokens) // P
    pages = pool.main_alloc.alloc(n)
    for layer_id, layer in enumerate(pool.main):
        for i, page in enumerate(pages):
            for off in range(P):
                pos = start + i * P + off
                layer.k_data[page, 0, off, :3] = torch.tensor([tokens[i * P + off], pos, layer_id])
                layer.v_data[page, 0, off, :3] = torch.tensor([pos, tokens[i * P + off], -layer_id])
    return pages


def _expected(tokens: Sequence[int], start: int, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(start, start + len(tokens), dtype=torch.float32)
    tok = torch.tensor(list(tokens), dtype=torch.float32)
    k = torch.stack([tok, pos, torch.full_like(pos, layer_id)], dim=-1)
    v = torch.stack([pos, tok, torch.full_like(pos, -layer_id)], dim=-1)
    return k, v


def check(tree: RadixCache, pool: KVPool) -> None:
    """Structural invariants plus: each node's pages (device and host) hold its key's tokens."""
    tree.check()
    host = tree.host
    stack: list[tuple[TreeNode, int]] = [(c, 0) for c in tree.root.children.values()]
    while stack:
        node, start = stack.pop()
        stack.extend((c, start + len(node.key)) for c in node.children.values())
        for layer_id, layer in enumerate(pool.main):
            want_k, want_v = _expected(node.key, start, layer_id)
            if node.pages is not None:
                got_k = layer.k_data[node.pages, 0, :, :3].reshape(-1, 3).float()
                got_v = layer.v_data[node.pages, 0, :, :3].reshape(-1, 3).float()
                assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v), f"{node!r}: device bytes"
            if node.host is not None and (node.pending is None or node.pending.done()):
                assert host is not None
                k_rows = host.host_segment(layer_id, 0)[node.host].view(torch.bfloat16).view(-1, P, 16)[:, :, :3]
                assert torch.equal(k_rows.reshape(-1, 3).float(), want_k), f"{node!r}: host bytes"


def scribble(pool: KVPool) -> None:
    """Overwrite every free device page (a freed page must never be read again)."""
    used = set(range(1, pool.main_alloc.num_pages + 1)) - set(pool.main_alloc._free)  # type: ignore[attr-defined]
    free = [p for p in range(1, pool.main_alloc.num_pages + 1) if p not in used]
    for layer in pool.main:
        layer.k_data[free] = -7
        layer.v_data[free] = -7


def seq(*pages: str) -> list[int]:
    """Tokens from page strings: ``seq("abcd", "efgh")``; every page is P letters."""
    assert all(len(p) == P for p in pages)
    return [ord(c) for p in pages for c in p]


def test_insert_match_split() -> None:
    pool = make_pool()
    tree = make_tree(pool)
    a = seq("abcd", "efgh", "ijkl")
    pages_a = store(pool, a)
    canon, node = tree.insert(a, pages_a)
    assert canon == pages_a and node.key == tuple(a)
    check(tree, pool)
    # Matches whole pages only: a partial page and a diverging page are not matched.
    m = tree.match_prefix(seq("abcd", "efgh", "ijkX") + [1, 2])
    assert m.pages == pages_a[:2] and m.host_pages == [] and len(m.node.key) == 2 * P
    assert len(tree.root.children) == 1 and len(m.node.children) == 1  # split into 2 + 1 pages
    check(tree, pool)
    b = seq("abcd", "efgh", "mnop", "qrst")
    pages_b = store(pool, b)
    canon_b, node_b = tree.insert(b, pages_b)
    assert canon_b == pages_a[:2] + pages_b[2:] and len(node_b.key) == 2 * P
    pool.main_alloc.free(pages_b[:2])  # duplicates: the caller frees its own copies
    check(tree, pool)
    assert tree.match_prefix(b).pages == canon_b
    assert tree.match_prefix(b, max_pages=3).pages == canon_b[:3]  # splits b's edge after 1 page
    assert tree.match_prefix(seq("zzzz")).pages == []
    assert tree.match_prefix(a[:7]).pages == pages_a[:1]  # 7 tokens: one whole page
    check(tree, pool)
    assert tree.evictable_pages == 5 and tree.protected_pages == 0


def test_branch_pages_where_a_match_leaves_the_tree_at_a_branch() -> None:
    """Inside an edge or at a node with other children: the pages matched; at a leaf's end, at the limit or
    with nothing matched: 0. The tree is left as it was (no split)."""
    pool = make_pool()
    tree = make_tree(pool)
    a = seq("abcd", "efgh", "ijkl")
    tree.insert(a, store(pool, a))
    assert tree.branch_pages(seq("abcd", "efgh", "XXXX"), 8) == 2  # inside a's edge
    assert len(tree.root.children) == 1 and len(next(iter(tree.root.children.values())).key) == 3 * P
    assert tree.branch_pages(a + seq("mnop"), 8) == 0  # past a leaf's end: an extension, not a branch
    assert tree.branch_pages(seq("abcd", "efgh", "XXXX"), 1) == 0  # the limit first
    assert tree.branch_pages(seq("zzzz"), 8) == 0
    b = seq("abcd", "efgh", "mnop")
    pages_b = store(pool, b)
    tree.insert(b, pages_b)  # splits a's edge after 2 pages: a node with two children
    pool.main_alloc.free(pages_b[:2])
    assert tree.branch_pages(seq("abcd", "efgh", "qrst"), 8) == 2  # at that node, no child matching
    check(tree, pool)


def test_lock_protects_and_lru_evicts_leaves_first() -> None:
    pool = make_pool(num_pages=16)
    tree = make_tree(pool)
    seqs = [seq("abcd", "0000"), seq("abcd", "1111"), seq("abcd", "2222")]
    for s in seqs:
        m = tree.match_prefix(s)
        own = store(pool, s[len(m.pages) * P :], start=len(m.pages) * P)
        tree.insert(s, m.pages + own)
    check(tree, pool)
    tree.match_prefix(seqs[0])  # 0 becomes the most recently used; 1 is the oldest leaf
    locked = tree.match_prefix(seqs[2]).node
    tree.lock(locked)
    assert tree.protected_pages == 2 and tree.evictable_pages == 2
    check(tree, pool)
    assert tree.evict(1) == 1  # leaf 1 (LRU) goes first
    assert tree.match_prefix(seqs[1]).pages == tree.match_prefix(seqs[0]).pages[:1]
    assert len(tree.match_prefix(seqs[0]).pages) == 2
    assert tree.evict(100) == 1  # leaf 0; "abcd" and leaf 2 are locked
    check(tree, pool)
    assert pool.main_alloc.num_used == 2 and tree.evictable_pages == 0
    tree.unlock(locked)
    with pytest.raises(RuntimeError):
        tree.unlock(locked)
    assert tree.evict(100) == 2 and pool.main_alloc.num_used == 0 and not tree.root.children
    check(tree, pool)


def test_write_back_round_trip_and_host_lru() -> None:
    pool = make_pool(num_pages=8)
    tree = make_hi(pool, 4)
    a, b = seq("abcd", "efgh"), seq("abcd", "wxyz")
    tree.insert(a, store(pool, a))
    pages_b = store(pool, b)
    _canon, _ = tree.insert(b, pages_b)
    pool.main_alloc.free(pages_b[:1])
    assert tree.evict(3) == 3 and pool.main_alloc.num_used == 0  # all three nodes moved to the host
    assert tree.num_written_back == 3 and tree.host_pages == 3
    scribble(pool)
    check(tree, pool)
    m = tree.match_prefix(b)
    assert m.pages == [] and len(m.host_pages) == 2
    m2, load = tree.load_back(m)
    assert load is not None and len(m2.pages) == 2 and m2.host_pages == [] and tree.num_loaded_back == 2
    check(tree, pool)  # device bytes restored exactly
    assert tree.match_prefix(a).pages == m2.pages[:1]  # "efgh" still only on the host
    assert len(tree.match_prefix(a).host_pages) == 1
    # Host LRU: a new leaf needs 2 host slots, 1 is free: the oldest host-only leaf ("efgh") goes.
    c = seq("cccc", "dddd")
    tree.insert(c, store(pool, c))
    node_b = tree.match_prefix(b).node
    tree.lock(node_b)
    assert tree.evict(2) == 2  # only c is unlocked
    check(tree, pool)
    assert tree.match_prefix(a).num_pages == 1 and tree.match_prefix(c).num_pages == 2
    tree.unlock(node_b)
    tree.evict(100)
    tree.evict_host(100)
    check(tree, pool)
    assert not tree.root.children and tree.host_pages == 0 and pool.main_alloc.num_used == 0


def test_write_through_backs_up_on_insert() -> None:
    pool = make_pool(num_pages=8)
    tree = make_hi(pool, 8, "write_through")
    a = seq("abcd", "efgh")
    tree.insert(a, store(pool, a))
    assert tree.host_pages == 2
    check(tree, pool)
    assert tree.evict(2) == 2 and tree.num_written_back == 0  # the copy already exists
    scribble(pool)
    m, _ = tree.load_back(tree.match_prefix(a))
    assert len(m.pages) == 2
    check(tree, pool)


def test_load_back_is_cut_to_free_device_pages() -> None:
    pool = make_pool(num_pages=4)
    tree = make_hi(pool, 8)
    a = seq("aaaa", "bbbb", "cccc")
    tree.insert(a, store(pool, a))
    tree.evict(3)
    hog = pool.main_alloc.alloc(2)  # only 2 device pages left
    m, load = tree.load_back(tree.match_prefix(a))
    assert load is not None and len(m.pages) == 2 and tree.match_prefix(a).host_pages != []
    check(tree, pool)
    pool.main_alloc.free(hog)


def test_without_host_a_full_tree_drops_nodes() -> None:
    pool = make_pool(num_pages=4)
    tree = make_tree(pool)
    a = seq("aaaa", "bbbb")
    tree.insert(a, store(pool, a))
    assert tree.evict(1) == 1 and tree.match_prefix(a).num_pages == 1 and tree.num_dropped == 1
    assert tree.evict(5) == 1 and not tree.root.children and pool.main_alloc.num_used == 0
    check(tree, pool)


def _peek_unchanged(tree: RadixCache, tokens: Sequence[int], max_pages: int | None = None) -> int:
    """``tree.peek_prefix``, checked to change nothing (no split, no LRU refresh)."""
    shape = lambda: sorted((n.key, n.last_access, id(n)) for n in tree._nodes())  # noqa: E731
    before = shape()
    n = tree.peek_prefix(tokens, max_pages)
    assert shape() == before
    return n


@pytest.mark.parametrize("host_pages,policy", [(0, "write_back"), (6, "write_back"), (10, "write_through")])
def test_random_operations_keep_invariants(host_pages: int, policy: str) -> None:
    """Random inserts, matches, locks, evictions and load-backs; every page accounted for throughout."""
    rng = random.Random(1234 + host_pages)
    pool = make_pool(num_pages=24)
    tree = make_hi(pool, host_pages, policy) if host_pages else make_tree(pool)
    alphabet = [seq(c * P) for c in "abc"]  # 3 distinct pages: lots of shared prefixes and splits
    locks: list[TreeNode] = []
    for step in range(300):
        tokens = [t for _ in range(rng.randint(1, 6)) for t in rng.choice(alphabet)]
        op = rng.random()
        if op < 0.45:  # a request: match (loading back), lock, store the rest, insert, unlock
            peeked = _peek_unchanged(tree, tokens)
            m = tree.match_prefix(tokens)
            assert len(m.pages) + len(m.host_pages) == peeked
            if isinstance(tree, HiRadixCache):
                m, _ = tree.load_back(m)
            tree.lock(m.node)
            rest = len(tokens) // P - len(m.pages)
            if pool.main_alloc.num_free < rest:
                tree.evict(rest - pool.main_alloc.num_free)
            if pool.main_alloc.num_free >= rest:
                own = store(pool, tokens[len(m.pages) * P :], start=len(m.pages) * P)
                canon, node = tree.insert(tokens, m.pages + own)
                assert canon[: len(m.pages)] == m.pages
                pool.main_alloc.free([o for o, c in zip(own, canon[len(m.pages) :]) if o != c])
                tree.lock(node)
                tree.unlock(m.node)
                m_node = node
            else:
                m_node = m.node
            if rng.random() < 0.3:
                locks.append(m_node)  # keep it locked for a while
            else:
                tree.unlock(m_node)
        elif op < 0.6 and locks:
            tree.unlock(locks.pop(rng.randrange(len(locks))))
        elif op < 0.8:
            tree.evict(rng.randint(1, 6))
        elif op < 0.9 and isinstance(tree, HiRadixCache):
            tree.evict_host(rng.randint(1, 4))
        else:
            k = rng.randint(0, 5)
            peeked = _peek_unchanged(tree, tokens, k)
            m = tree.match_prefix(tokens, max_pages=k)
            assert len(m.pages) + len(m.host_pages) == peeked
        scribble(pool)
        check(tree, pool)
        assert len(tree.device_page_ids()) == pool.main_alloc.num_used, f"step {step}: device pages leaked"
        if tree.host is not None:
            assert tree.host_pages == tree.host.alloc.num_used, f"step {step}: host slots leaked"
    if isinstance(tree, HiRadixCache):  # the random walk did exercise both directions
        assert tree.num_written_back + (tree.host_pages if policy == "write_through" else 0) > 0
        assert tree.num_loaded_back > 0
    for node in locks:
        tree.unlock(node)
    tree.evict(10**6)
    if isinstance(tree, HiRadixCache):
        tree.evict_host(10**6)
    check(tree, pool)
    assert pool.main_alloc.num_used == 0 and not tree.root.children
    assert tree.host is None or tree.host.alloc.num_used == 0
