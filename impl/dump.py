"""Readable dumps of a prefix cache's trie: text for logs and errors, JSON for
the server's GET /trie. Read-only: nothing here changes the cache."""
from __future__ import annotations

import time

from impl.trie import Node


def text(pc) -> str:
    """A readable tree: offsets, token count, bytes, flags, age."""
    now, active = time.monotonic(), set(map(id, pc.path))
    lines = [f"prefix cache: offset {pc.offset}, paged out {pc.counter} B "
             f"(budget {pc.budget}), nodes {len(pc.trie.nodes())}"]

    def visit(n: Node, depth: int) -> None:
        kinds = "".join("-" if s is None else ("k" if s.kind == "kv" and not s.lazy else
                        "v" if s.kind == "kv" else "w" if s.kind == "windowed" else "r")
                        for s, c in zip(n.snaps, pc.caches) if c is not None)
        flags = [f for f, on in (("user", n.user), ("active", id(n) in active),
                                 ("frontier", n is pc.frontier)) if on]
        label = "root" if n is pc.root else f"[{n.start},{n.end}) {len(n.edge)}t {n.bytes()}B {kinds}"
        lines.append("  " * depth + f"{label} age {now - n.used_at:.3f}s" + (f" ({', '.join(flags)})" if flags else ""))
        for c in n.children.values():
            visit(c, depth + 1)
    visit(pc.root, 0)
    return "\n".join(lines)


def as_json(pc) -> dict:
    now, active = time.monotonic(), set(map(id, pc.path))

    def node(n: Node) -> dict:
        return {"start": n.start, "end": n.end, "tokens": len(n.edge), "bytes": n.bytes(),
                "user": n.user, "active": id(n) in active, "last_used": n.last_used,
                "age_s": round(now - n.used_at, 6),
                "snapshots": [None if s is None else {"kind": s.kind, "start": s.start, "end": s.end,
                                                      "lazy": s.lazy, "bytes": s.size} for s in n.snaps],
                "children": [node(c) for c in n.children.values()]}
    return {"offset": pc.offset, "paged_out": pc.counter, "budget": pc.budget,
            "clock": pc.clock, "root": node(pc.root)}
