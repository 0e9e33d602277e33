"""Which rules apply to mlx-lm's LRUPromptCache, how each is judged, and whose code breaks it.

Applicable rules (REFERENCE section 3, read for a cache of whole-state entries):
  C1  the server's logprobs after a restore are bit-identical to a cold run of the same schedule of
      forwards on fresh stock caches (the forwards that built the served entry, the fetch's trim,
      the request's own forwards; every generated step), where that replay is measured exact; a
      calibrated tolerance only where it is not (inexact_kinds) or no stock trim reaches the state;
  C2  the fetch resumes at the deepest offset some stored entry can serve, given which caches can be
      trimmed (mlx-lm's own can_trim_prompt_cache), and never past len(prompt) - 1 (one prompt token
      is left to evaluate);
  E1  at rest (between requests) the bytes held are within --prompt-cache-bytes and the entries
      within --prompt-cache-size;
  E3  least recently USED first -- a fetch that serves an entry is a use. An eviction that skips an
      older entry of the same segment type is a violation; one explained only by CacheOrder's
      per-type priority is reported apart, as a policy difference;
  A1  the byte counter (`nbytes`) equals the bytes its entries' caches hold;
  T1, T2  well-formedness of the view this module builds (a self-check of the mapping).

Invariants: a Finding names its rule, its cause (a key of CAUSES: the mlx-lm function and the line
quoted) and its kind ("violation" | "policy"); the checker never reports a violation its own reading
of mlx-lm's code cannot attribute to a line of mlx-lm.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass


from targets.base import ALL_RULES
from targets.mlx_lm.oracle import (INEXACT_BATCHED, TOL, _direct_ok, calibrate, cold_logprobs,  # noqa: F401
                                   compare, cut_schedule, inexact_kinds, own_ops, replay, tolerance)

RULES = frozenset({"C1", "C2", "E1", "E3", "A1", "T1", "T2", "S2"})
NOT_APPLICABLE = {
    "T3": "no live caches persist between requests; the fetched cache's layer offsets are part of C1",
    "S1": "an entry holds KV for [0, end) as one full copy, never per-edge slices (its design)",
    "S3": "there is no page-out of a frontier: entries are inserted whole at segment ends and at finish",
    "S4": "entries are never split",
    "M1": "no non-causal media on this path (requests with images take the sequential path)",
    "M2": "no non-causal media on this path (requests with images take the sequential path)",
    "M3": "no non-causal media on this path (requests with images take the sequential path)",
    "P1": "a resume inside an entry trims a deep copy; the stored entry is never split",
    "P2": "no compaction: entries never merge",
    "G1": "entries never merge",
    "G2": "entries never merge",
    "E2": "its design protects nothing: any entry may be evicted",
    "E4": "eviction removes one whole entry; nothing merges",
    "E5": "no checkpoint is folded away; the deepest surviving entry is C2's target",
    "A2": "entries are Python objects freed by the garbage collector; snapshots have no identities",
    "A3": "the allocator's memory is not judged per operation here; bytes held are judged by E1 and A1",
}
assert set(NOT_APPLICABLE) | RULES == set(ALL_RULES) and not set(NOT_APPLICABLE) & RULES

@dataclass(frozen=True)
class Cause:
    rule: str
    module: str            # "mlx_lm.models.cache" | "mlx_lm.server"
    function: str          # qualified name inside the module
    quote: str             # a substring of the responsible line
    why: str


CAUSES = {
    "exact-hit-no-seed": Cause("C2", "mlx_lm.models.cache", "LRUPromptCache.fetch_nearest_cache",
                               "return copy.deepcopy(cache_entry.prompt_cache), []",
                               "an exact hit returns the whole cache and no token to evaluate; the server "
                               "then passes empty segments to BatchGenerator.insert_segments, which raises, "
                               "and its generation thread dies"),
    "one-token-prefix": Cause("C2", "mlx_lm.models.cache", "PromptTrie.search", "if last_index > 0:",
                              "a stored one-token prefix (last_index == 0) is never returned as `shorter`; "
                              "with caches that cannot be trimmed the request re-prefills from 0"),
    "shallower-restore": Cause("C2", "mlx_lm.models.cache", "LRUPromptCache.fetch_nearest_cache",
                               "if can_trim_prompt_cache(cache_entry.prompt_cache):",
                               "only the shortest entry below the deepest matched node is tried for trimming "
                               "(PromptTrie.search); when it cannot be trimmed (a RotatingKVCache past its "
                               "window) a trimmable entry that branched off earlier is never considered and "
                               "the fetch falls back to a shorter prefix or to nothing"),
    "fetch-not-a-use": Cause("E3", "mlx_lm.models.cache", "LRUPromptCache.fetch_nearest_cache",
                             "result = self._trie.search(model, tokens)",
                             "a fetch never touches CacheOrder (only insert_cache pushes), so recency is "
                             "insertion order: an entry served a moment ago goes before an older, unused one"),
    "typed-priority": Cause("E3", "mlx_lm.models.cache", "LRUPromptCache.CacheOrder.pop",
                            "if lru_a and len(lru_a) >= len(lru_b):",
                            "eviction picks a segment type first (assistant before user before system, by "
                            "queue length), then the oldest of that type"),
    "bytes-limit-not-passed": Cause("E1", "mlx_lm.server", "run",
                                    "prompt_cache = LRUPromptCache(model_provider.cli_args.prompt_cache_size)",
                                    "--prompt-cache-bytes never reaches LRUPromptCache (max_bytes stays 2**63). "
                                    "The batched path trims only when a request is added (trim_to), so the "
                                    "entries inserted while it runs stay over the limit at rest; the "
                                    "sequential path (a seed, --kv-bits, a draft model, images, caches that "
                                    "cannot merge) never trims: every request's entry stays until "
                                    "--prompt-cache-size evicts, and the bytes held grow without bound"),
    "resume-behind-match": Cause("C2", "mlx_lm.models.cache", "LRUPromptCache.fetch_nearest_cache",
                                 "if short_length > 0:",
                                 "no checkpoint where the conversation diverged: caches that cannot be trimmed "
                                 "resume at the last stored prefix (segment ends, finished requests)"),
    "trim-partial": Cause("C1", "mlx_lm.models.cache", "ChunkedKVCache.trim",
                          "n = min(self.offset - self.start_position, n)",
                          "ChunkedKVCache claims to be trimmable but trims only back to its chunk window's "
                          "start; trim_prompt_cache reports layer 0's count, and fetch_nearest_cache "
                          "serves the cache as if every layer went back: a layer still holds the later "
                          "tokens, and the resumed request is computed on them"),
    "trim-partial-stored": Cause("S2", "mlx_lm.models.cache", "ChunkedKVCache.trim",
                                 "n = min(self.offset - self.start_position, n)",
                                 "an entry's ChunkedKVCache layers rest past its key: a fetch trimmed them only "
                                 "part of the way and the request's tokens were appended after the rest"),
    "draft-behind": Cause("S2", "mlx_lm.server", "ResponseGenerator._serve_single",
                          "cache += make_prompt_cache(self.model_provider.draft_model)",
                          "with a draft model the entry stores the draft's caches too, and they rest short "
                          "of the key (speculative decoding leaves the draft behind the accepted tokens); "
                          "a later fetch trims both by the same count, so the draft resumes at the wrong "
                          "positions (slower drafting; the main model's output is unaffected)"),
    "speculative-key-ahead": Cause("S2", "mlx_lm.server", "ResponseGenerator._serve_single",
                                   "cache_key.append(gen.token)",
                                   "with a draft model the key gets every emitted token, but speculative "
                                   "decoding has not run the main model on the last one (it is fed with the "
                                   "next step): the entry is stored one token past its cache, and a fetch "
                                   "that serves it skips that token's forward"),
    "generate-differs": Cause("C1", "mlx_lm.generate", "generate_step",
                              "return model(input_tokens, cache=prompt_cache)",
                              "the fetched cache is right but generation from it differs from the replay"),
    "count-limit": Cause("E1", "mlx_lm.models.cache", "LRUPromptCache.insert_cache",
                         "if len(self._lru) > self.max_size:", "more entries than --prompt-cache-size at rest"),
    "counter-drift": Cause("A1", "mlx_lm.models.cache", "LRUPromptCache.insert_cache",
                           "self._n_bytes += entry.nbytes", "the byte counter differs from its entries' bytes"),
    "entry-not-at-its-end": Cause("S2", "mlx_lm.models.cache", "LRUPromptCache.insert_cache",
                                  "prev = self._trie.add(model, tokens, entry)",
                                  "an entry is stored under a key its cache does not rest at the end of (layers "
                                  "with an offset: KV, rotating); an exact hit or a trim then restores the wrong "
                                  "positions. Recurrent layers have no offset and are judged by C1"),
    "view-links": Cause("T1", "mlx_lm.models.cache", "PromptTrie.add", 'current["__value__"] = value',
                        "the trie read back from PromptTrie's nested dicts does not link up (T1): a node whose "
                        "start no stored entry or branch point ends at; the program shows which insert did it"),
    "view-siblings": Cause("T2", "mlx_lm.models.cache", "PromptTrie.add", "current[tok] = {}",
                           "two children of one node share a first token (T2)"),
    "restore-differs": Cause("C1", "mlx_lm.models.cache", "LRUPromptCache.fetch_nearest_cache",
                             "trim_prompt_cache(cache, num_to_trim)",
                             "the restored cache is not equivalent to a cold prefill of the tokens it covers"),
    "batch-differs": Cause("C1", "mlx_lm.generate", "BatchGenerator._next",
                           "self._prompt_batch.prompt(prompts)",
                           "the fetched cache is right but generation from it differs from a cold prefill"),
}


def quote(cause: Cause) -> tuple:
    """(file, line number, line text) of the cause's quoted line in the installed mlx-lm."""
    import importlib
    obj = importlib.import_module(cause.module)
    for part in cause.function.split("."):
        obj = getattr(obj, part)
    lines, start = inspect.getsourcelines(obj)
    for i, text in enumerate(lines):
        if cause.quote in text:
            return inspect.getsourcefile(obj), start + i, text.strip()
    return inspect.getsourcefile(obj), start, lines[0].strip()


@dataclass(frozen=True)
class Finding:
    rule: str
    cause: str
    kind: str              # "violation" | "policy"
    step: int              # index of the request in the program
    message: str


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def deepest(prompt, entries: dict) -> tuple:
    """(r, key): the deepest offset r <= len(prompt) - 1 a stored entry can serve, and that entry.
    A stored prefix serves its own length; a trimmable entry serves its common prefix with the prompt."""
    m = len(prompt) - 1
    best, by = 0, None
    for k, e in entries.items():
        c = common_prefix(k, prompt)
        r = len(k) if c == len(k) and len(k) <= m else (min(c, m) if e.trimmable else 0)
        if r > best:
            best, by = r, k
    return best, by


class Checker:
    """Observes a ServerDriver and records Findings. `enabled`: rule ids judged (default RULES)."""

    def __init__(self, enabled=None):
        self.enabled = set(RULES if enabled is None else enabled)
        self.findings: list = []
        self.clock = 0
        self.last_used: dict = {}     # key -> clock of its last certain use (insert, or the one entry served)
        self.maybe_used: dict = {}    # key -> clock of its last possible use (also ambiguous fetches)
        self.step = -1
        self._before = {}
        self.e1_worst: dict = {}      # path -> the largest excess over --prompt-cache-bytes seen at rest
        self.paths: dict = {}         # path -> requests served on it

    def _add(self, rule, cause, kind, message):
        if rule in self.enabled:
            self.findings.append(Finding(rule, cause, kind, self.step, message))

    def violations(self):
        return [f for f in self.findings if f.kind == "violation"]

    # ------------------------------------------------------------ C2
    def before_fetch(self, d, prompt):
        self.step += 1
        self.clock += 1
        self._before = d.entries()

    def after_fetch(self, d, res):
        prompt, count = list(res.prompt), res.count
        if count > len(prompt) - 1:
            self._add("C2", "exact-hit-no-seed", "violation",
                      f"resumed at {count} of {len(prompt)} prompt tokens: no token is left to evaluate")
        else:
            r, by = deepest(prompt, self._before)
            if count < r:
                cause = "one-token-prefix" if len(by) == 1 and tuple(prompt[:1]) == by else "shallower-restore"
                self._add("C2", cause, "violation",
                          f"resumed at {count}; the entry {list(by)} serves {r} (trimmable: "
                          f"{self._before[by].trimmable})")
            match = min(max([0] + [common_prefix(k, prompt) for k in self._before]), len(prompt) - 1)
            if count == r and count < match:
                self._add("C2", "resume-behind-match", "policy",
                          f"resumed at {count} of a {match}-token match: no entry it can serve there")
        for k in res.served:                                   # a fetch that serves tokens uses the entry
            self.maybe_used[k] = self.clock
        if len(res.served) == 1:
            self.last_used[res.served[0]] = self.clock

    # ------------------------------------------------------------ E3
    def _evictions(self, d, before, inserted=None, inserted_type=None, trimmable=False):
        after = d.entries()
        gone = set(before) - set(after)
        if inserted is not None:
            if trimmable:                  # insert_cache drops the prefixes a trimmable entry covers
                gone = {k for k in gone if not (len(k) < len(inserted) and inserted[:len(k)] == k)}
            if inserted not in after:      # evicted at once (its own insert went over a limit)
                gone.add(inserted)
        types = {k: e.cache_type for k, e in {**before, **after}.items()}
        if inserted is not None:
            types[inserted] = inserted_type
        survivors = [k for k in after if k != inserted]
        hi = lambda k: max(self.maybe_used.get(k, 0), self.last_used.get(k, 0))
        for g in sorted(gone, key=lambda k: self.last_used.get(k, 0)):
            # s was certainly used less recently than g was certainly used (sound when a fetch could
            # have served from several entries: no resolution of that ambiguity clears it)
            older = [s for s in survivors if hi(s) < self.last_used.get(g, 0)]
            same = [s for s in older if types[s] == types[g]]
            if same:
                s = min(same, key=lambda k: self.last_used.get(k, 0))
                self._add("E3", "fetch-not-a-use", "violation",
                          f"evicted {types[g]} entry of {len(g)} tokens (last used at {self.last_used.get(g)}) "
                          f"before {types[s]} entry of {len(s)} tokens (last used at {self.last_used.get(s)})")
            elif older:
                s = min(older, key=lambda k: self.last_used.get(k, 0))
                self._add("E3", "typed-priority", "policy",
                          f"evicted {types[g]} entry of {len(g)} tokens (last used at {self.last_used.get(g)}) "
                          f"before {types[s]} entry of {len(s)} tokens (last used at {self.last_used.get(s)})")
        for k in set(before) - set(after):
            self.last_used.pop(k, None)
            self.maybe_used.pop(k, None)

    def after_insert(self, d, before, key, cache_type, trimmable):
        self.clock += 1
        self.last_used[key] = self.maybe_used[key] = self.clock
        self._evictions(d, before, key, cache_type, trimmable)

    def after_trim(self, d, before):
        self._evictions(d, before)

    # ------------------------------------------------------------ C1, E1, A1 (at rest)
    def _on_path(self, path):
        self.paths[path] = self.paths.get(path, 0) + 1
        return self.paths[path]

    def after_request(self, d, res, gen):
        if res.crash is None and "C1" in self.enabled:
            self._c1(d, res, gen)
        entries = d.entries()
        path = getattr(res, "path", "batched")
        on_path = self._on_path(path)
        if d.prompt_cache_bytes is not None:
            held, limit = int(d.lru.nbytes), d.prompt_cache_bytes
            w = self.e1_worst.get(path)
            if w is None or held - limit > w["held"] - w["limit"]:
                self.e1_worst[path] = {"held": held, "limit": limit, "entries": len(entries),
                                       "request": self.step, "requests_on_path": on_path}
            if held > limit:
                self._add("E1", "bytes-limit-not-passed", "violation",
                          f"{held} bytes held at rest in {len(entries)} entries after a request on the "
                          f"{path} path; --prompt-cache-bytes {limit}")
        if len(entries) > d.prompt_cache_size:
            self._add("E1", "count-limit", "violation",
                      f"{len(entries)} entries at rest; --prompt-cache-size {d.prompt_cache_size}")
        n_main = len(d.model.layers) if entries else 0
        for key, e in entries.items():                    # S2: an entry's layers rest at its end
            off = [(i, o) for i, o in enumerate(e.offsets) if o >= 0 and o != len(key)]
            if off:
                kinds = {e.kinds[i] for i, _ in off}
                cause = ("draft-behind" if all(i >= n_main for i, _ in off) else
                         "trim-partial-stored" if kinds == {"ChunkedKVCache"} else
                         "speculative-key-ahead" if d.draft_model is not None else "entry-not-at-its-end")
                self._add("S2", cause, "violation",
                          f"an entry of {len(key)} tokens holds layers at offsets "
                          + ", ".join(f"{o} (layer {i}{' of the draft model' if i >= n_main else ''}: "
                                      f"{e.kinds[i]})" for i, o in off))
        held = sum(e.held for e in entries.values())
        if held != d.lru.nbytes:
            self._add("A1", "counter-drift", "violation", f"counter {d.lru.nbytes} != bytes held {held}")
        try:
            view = view_of(d)
        except ValueError as e:                           # View.from_dict: links that do not agree
            self._add("T1", "view-links", "violation", f"the trie's view is malformed: {e}")
            return
        for f in spec_check(view):                        # the spec's own predicates on the view
            self._add(f.rule, VIEW_CAUSE[f.rule], "violation", str(f))

    def _c1(self, d, res, gen):
        """C1 against a cold run of the same schedule (REFERENCE C1): fresh stock caches are fed the
        forwards that built the served entry, its trim, then the request's own forwards, and the
        server's logprobs must be bit-identical to the replay's -- or within tolerance() where the
        replay is measured not to be exact (inexact_kinds). A trim that a stock layer cannot make in
        full (ChunkedKVCache past its chunk window) has no exact replay: the schedule is then cut at
        the trimmed length and judged within tolerance()."""
        model = d.model
        inexact = inexact_kinds(d, res.path)
        worst = None
        for bi, base in enumerate(res.bases):
            ops = base + own_ops(res.count, res.own)
            ref, exact = replay(model, ops)
            if not exact:
                ops = cut_schedule(ops)
                ref, _ = replay(model, ops)
            bound = 0.0 if exact and not inexact else tolerance(model)
            diff, step, greedy = compare(res, ref)
            if diff <= bound and greedy is None:
                res.base_index = bi
                return
            if worst is None or diff < worst[0]:
                worst = (diff, step, greedy, bound, exact, ops)
        diff, step, greedy, bound, exact, ops = worst
        how = ("bit-identical required" if bound == 0.0 else
               f"tolerance {bound:.3g}: " + ("; ".join(inexact) if inexact else
                                             "no exact replay: a trim no stock layer makes in full"))
        stale = [type(c).__name__ for c in (res.fetched or []) if isinstance(getattr(c, "offset", None), int)
                 and c.offset != res.count]
        if not exact or (stale and set(stale) == {"ChunkedKVCache"}):
            cause = "trim-partial"          # (a trim to 0 serves a cache too: no entry to replay, layers stale)
        elif _direct_ok(model, res, ops, bound):
            cause = "batch-differs" if res.path == "batched" else "generate-differs"
        else:
            cause = "restore-differs"
        self._add("C1", cause, "violation",
                  f"step {step} after resuming at {res.count} ({res.path} path): max |logprob - same-schedule "
                  f"replay| = {diff:.3g} ({how})" + (f"; greedy {greedy[0]} vs replay {greedy[1]}" if greedy else ""))


VIEW_CAUSE = {"T1": "view-links", "T2": "view-siblings"}


def spec_check(view) -> list:
    """spec.rules' state predicates for the structure rules (T1, T2) on the view of mlx-lm's trie."""
    from spec import rules as spec_rules
    return spec_rules.check(view, rules={"T1", "T2"})


def view_of(d):
    from targets.mlx_lm.view import view_of as build
    return build(d)
