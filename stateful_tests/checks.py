"""The checks the conformance machines run after every rule (mixins of
stateful_tests.machines' ConformanceMachine, whose CHECKS tuple orders them):

- `DecisionJudges` (not after every rule: inside operations): E2 on every
  victim impl's eviction picks, S1 before every compaction;
- `RuleChecks`: C1 on both sides, impl's own checked rules, spec.rules' state
  rules on the abstraction of impl and on the spec, conformance field by field;
- `ToolingChecks`: what impl reports to people (not the prefix cache's rules):
  the dumps a maintainer reads (GET /trie, as text and as JSON), the Stats
  close() returns, and the bookkeeping-time figure of the benchmarks. They
  run after the rule checks, so a broken rule is reported as such first.

Also here: the parsers of impl's dump formats (a regex per line of the text
dump), and the spec-side rows those dumps must show.
"""
from __future__ import annotations

import re
import time
from collections import Counter

import spec.rules
from impl.invariants import violations as impl_violations
from spec.view import freeze
from stateful_tests.abstraction import canon, first_difference, snap_bytes
from stateful_tests.requests import BytesOnlyItem


class DecisionJudges:
    """Rules judged where impl decides them, mid-operation, so a bug there is
    reported as that rule and not as a crash later inside a merge. The
    machine installs them around impl's `_victim` and `_compact` (configure)
    and provides `ip`, `LAYERS` and `_impl_victims`."""

    def _impl_view(self):
        """impl's trie as the rules' view, mid-operation (no contents)."""
        ip = self.ip
        return freeze(ip.root, ip.path, layers=self.LAYERS, offset=len(ip.seq), seq=ip.seq,
                      live=[None] * len(self.LAYERS), counter=ip.counter, budget=ip.budget, clock=ip.clock,
                      snaps_of=lambda n: [(i, s) for i, s in enumerate(n.snaps) if s is not None])

    def _before_compaction(self):
        """S1, judged before impl compacts (after each capture attach puts on a
        node, after page-out, after a leaf eviction): every KV snapshot spans
        its node's edge, before a merge could concatenate a misplaced one."""
        v = spec.rules.check(self._impl_view(), rules={"S1"})
        assert not v, "S1 violated by impl before compaction: " + "; ".join(map(str, v))

    def _victim_chosen(self, victim):
        """E2, judged where impl decides protection: the victim its eviction
        chose must be one the rule lets go (not the root, the frontier or a
        branch point), before it is merged or removed."""
        if victim is None:
            return None
        keys = victim.path_keys()
        v = self._impl_view()
        node = v.node(keys)
        assert spec.rules.e2_evictable(v, node), \
            f"E2 violated by impl: eviction chose {node}, which is protected (root, frontier or branch point)"
        self._impl_victims.append(keys)
        return victim


class RuleChecks:
    """Checks of the rules and of conformance; the machine provides `ip`,
    `sp`, `req`, `abstraction()` and `views()`."""

    def excused(self, found) -> list:
        """The violations in `found` (Violations or their text) but one clause:
        spec.rules' M2 "no stored node ends strictly inside one of the open
        request's non-causal items" presumes folds that hash run length and
        causality. A request with a bytes-only item (requests.Media) drops
        that presumption on purpose (a stored path of the same keys evaluated
        causally, or shorter), so for it that clause alone is not asked, here
        and in impl's checked mode (off for such a request, see _begin)."""
        if self.req is None or not any(isinstance(it, BytesOnlyItem) for it in self.req.media):
            return list(found)
        return [v for v in found if not (str(v).startswith("M2") and "snapshot ends inside" in str(v))]

    def c1_live_equals_cold_prefill(self):
        """C1: every layer's live content (decoded from the real caches) equals
        a cold prefill of the keys evaluated so far; the spec's too."""
        spec_view, impl_view = self.views()
        v = spec.rules.c1_cold_equivalence(impl_view) + [
            f"(spec) {x}" for x in spec.rules.c1_cold_equivalence(spec_view)]
        assert not v, "C1 violated: " + "; ".join(map(str, v))

    def impl_own_invariants(self):
        """impl's own checked rules (impl/invariants.py) hold."""
        v = self.excused(impl_violations(self.ip))
        assert not v, "impl invariants violated: " + "; ".join(v)

    def rules_hold_on_impl(self):
        """Every state rule of spec.rules holds on the abstraction of impl."""
        v = self.excused(spec.rules.check(self.views()[1]))
        assert not v, "rules violated by impl (abstracted): " + "; ".join(map(str, v))

    def rules_hold_on_spec(self):
        """... and on the spec itself (a failure here is a spec bug)."""
        v = self.excused(spec.rules.check(self.views()[0]))
        assert not v, "rules violated by the spec: " + "; ".join(map(str, v))

    def spec_equals_impl(self):
        """Conformance: the abstraction of impl equals the spec, field by field."""
        ca, cs = canon(self.abstraction()), canon(self.sp)
        if ca != cs:
            diffs = [first_difference(cs[k], ca[k]) if k == "tree" else f"{k}: spec {cs[k]!r}, impl {ca[k]!r}"
                     for k in cs if ca[k] != cs[k]]
            raise AssertionError("conformance mismatch in " + ", ".join(repr(k) for k in cs if ca[k] != cs[k])
                                 + ":\n  " + "\n  ".join(diffs))


class ToolingChecks:
    """Checks of impl's reported figures; the machine provides `ip` (impl),
    `sp` (spec), `_closed_stats`, `_bookkeeping` and `_born`."""

    def tooling_bookkeeping_time_is_measured(self):
        """impl's bookkeeping_s (the overhead figure the benchmarks report)
        starts at 0, never decreases, and grows by at most the wall time that
        passed since the last check."""
        if self.ip is None:
            return
        (before, since), now, b = self._bookkeeping, time.perf_counter(), self.ip.bookkeeping_s
        assert before <= b <= before + (now - since), \
            f"bookkeeping_s went from {before} to {b} in {now - since:.6f} s of wall time"
        self._bookkeeping = (b, now)

    def tooling_close_reports_the_spec_figures(self):
        """The Stats close() returned (what the Engine and the benchmarks
        report) are the spec's figures for that request."""
        if self._closed_stats is not None:
            (got, want), self._closed_stats = self._closed_stats, None
            assert got == want, f"request stats from close: impl {got}, spec {want}"

    def tooling_dumps_describe_the_spec_trie(self):
        """The dumps a maintainer reads (GET /trie as text and as JSON) tell
        the truth: node for node, the spec's offsets, bytes, flags, clock and
        snapshots; the header's offset, paged-out counter and budget."""
        if self.ip is None:
            return
        want_json, want_text = spec_dump_view(self.sp)
        got = self.ip.dump_json()
        head = {k: got[k] for k in ("offset", "paged_out", "budget", "clock")}
        assert head == want_json["head"], f"dump_json header {head}, spec {want_json['head']}"
        assert json_dump_nodes(got["root"]) == want_json["nodes"], \
            f"dump_json nodes {json_dump_nodes(got['root'])}, spec {want_json['nodes']}"
        text, ages = text_dump_view(self.ip.dump())
        alive = time.monotonic() - self._born + 0.0005       # taken after both dumps; .3f rounds up to 0.5 ms
        assert text == want_text, f"dump text {text}, spec {want_text}"
        ages += json_dump_ages(got["root"])
        assert all(0 <= a <= alive for a in ages), f"node ages {ages} outside [0, {alive:.3f}] s"


def spec_dump_view(sp) -> tuple:
    """What impl's dump_json() and dump() must show for the spec state `sp`:
    ({"head": ..., "nodes": Counter of node rows}, (header, Counter of text rows)).
    Rows are (depth, start, end, ...) so that sibling order does not matter."""
    active, frontier = {id(n) for n in sp.path}, sp.path[-1]
    rows, text = Counter(), Counter()

    def visit(n, depth):
        snaps = tuple(None if (s := n.snaps.get(i)) is None else (s.kind, s.start, s.end, s.lazy, snap_bytes(sp, i, s))
                      for i in range(len(sp.layers)))
        nbytes = sum(x[4] for x in snaps if x is not None)
        rows[(depth, n.start, n.end, len(n.edge), nbytes, n.user, id(n) in active, n.last_used, snaps)] += 1
        kinds = "".join("-" if x is None else "v" if x[0] == "kv" and x[3] else x[0][0]
                        for x, layer in zip(snaps, sp.layers) if layer.kind is not None)
        flags = frozenset(f for f, on in (("user", n.user), ("active", id(n) in active),
                                          ("frontier", n is frontier)) if on)
        text[(depth, None if n is sp.trie.root else (n.start, n.end, len(n.edge), nbytes, kinds), flags)] += 1
        for c in n.children:
            visit(c, depth + 1)
    visit(sp.trie.root, 0)
    head = {"offset": sp.offset, "paged_out": sp.trie.counter, "budget": sp.budget, "clock": sp.clock}
    header = (sp.offset, sp.trie.counter, sp.budget, sum(text.values()))
    return {"head": head, "nodes": rows}, (header, text)


def json_dump_nodes(root) -> Counter:
    """impl's dump_json()["root"] as the rows of spec_dump_view."""
    rows = Counter()

    def visit(d, depth):
        snaps = tuple(None if s is None else (s["kind"], s["start"], s["end"], s["lazy"], s["bytes"])
                      for s in d["snapshots"])
        rows[(depth, d["start"], d["end"], d["tokens"], d["bytes"], d["user"], d["active"], d["last_used"],
              snaps)] += 1
        for c in d["children"]:
            visit(c, depth + 1)
    visit(root, 0)
    return rows


def json_dump_ages(root) -> list:
    """Every node's age_s in dump_json(): a float in seconds, to the microsecond."""
    ages, stack = [], [root]
    while stack:
        d = stack.pop()
        a = d["age_s"]
        assert isinstance(a, float) and round(a, 6) == a, f"age_s {a!r} is not seconds to the microsecond"
        ages.append(a)
        stack.extend(d["children"])
    return ages


_DUMP_HEADER = re.compile(r"^prefix cache: offset (\d+), paged out (\d+) B \(budget (\d+)\), nodes (\d+)$")
_DUMP_LINE = re.compile(r"^(?P<indent> *)(?:root|\[(\d+),(\d+)\) (\d+)t (\d+)B ([-kvwr]*)) age (?P<age>-?\d+\.\d{3})s"
                        r"(?: \((?P<flags>[a-z, ]+)\))?$")


def text_dump_view(dump: str) -> tuple:
    """impl's dump() text as the (header, rows) of spec_dump_view, and the node ages."""
    first, *lines = dump.splitlines()
    m = _DUMP_HEADER.match(first)
    assert m, f"dump header unreadable: {first!r}"
    rows, ages = Counter(), []
    for line in lines:
        d = _DUMP_LINE.match(line)
        assert d, f"dump line unreadable: {line!r}"
        start, end, tokens, nbytes, kinds = d.groups()[1:6]
        node = None if start is None else (int(start), int(end), int(tokens), int(nbytes), kinds)
        flags = frozenset(d.group("flags").split(", ")) if d.group("flags") else frozenset()
        rows[(len(d.group("indent")) // 2, node, flags)] += 1
        ages.append(float(d.group("age")))
    return (tuple(int(x) for x in m.groups()), rows), ages
