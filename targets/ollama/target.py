"""A Target (targets/base.py) served by a harness process speaking the JSON-lines
protocol of harness/driver_test.go: Ollama's prefix cache built by build.py, or
our own Go fixture (fixture/).

Invariants:
  - one process serves many examples: `reset` starts each one afresh (a new
    prefixCache over new fakes); the process is restarted only if it dies;
  - keys on the wire are uint32 (Ollama's alphabet): token ids below 2**31 as
    they are, fold values as 2**31 | (fold mod 2**31) (`wire_key`); views come
    back in that alphabet;
  - a Go panic is a finding (TargetPanic, the cache's state is then undefined
    until the next reset); a dead process is a HarnessCrash.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from types import MappingProxyType

from spec.view import View
from targets.viewcheck import view_of

FOLD = 1 << 31
COST = {"kv": 16, "windowed": 16, "recurrent": 12}
LAYOUTS = ("transformer", "sliding", "recurrent", "stateless", "hybrid")
# The same layouts with the KV fakes' snapshots made lazy views of the live rows, as Ollama's KVCache
# makes them (harness/driver_test.go): the byte counter then moves through the materialise hooks.
LAZY_LAYOUTS = tuple(f"{name}-lazy" for name in LAYOUTS)
# The same layouts plus a draft KV cache with one token of look-ahead (harness/draft_test.go), as Ollama's runner
# builds them for a model with an MTP draft head: trie keys pack token pairs, and the views show those pairs.
DRAFT_LAYOUTS = tuple(f"{name}-draft" for name in LAYOUTS)


def wire_key(k: int) -> int:
    return k if k < FOLD else FOLD | (k & (FOLD - 1))


def without_nodes(v: View) -> View:
    """The view with the root alone in its trie (what M2's capture clause reads: the open request)."""
    return dataclasses.replace(v, nodes=MappingProxyType({(): v.root}), path=((),))


class TargetPanic(Exception):
    """The cache under test panicked on an operation."""


class HarnessCrash(Exception):
    """The harness process died or answered garbage."""


class HarnessTarget:
    """Drives one harness binary. `layout` picks the fake-cache layout."""

    RULES = frozenset({"T1", "T2", "T3", "S1", "S2", "S3", "S4", "M2", "M3", "P1", "G1", "G2", "E1", "E2", "E3",
                       "E4", "E5", "A1", "A2", "C1", "C2"})
    NOT_APPLICABLE = {
        "M1": "chunk boundaries are chosen by Ollama's pipeline (Runner.prefill, media.extendChunk), "
              "which needs a model; the harness mirrors it, so M1 would judge the harness",
        "P2": "compaction extent is policy here: Ollama compacts only the path's last node (compactPath)",
        "A3": "memory of MLX arrays: the fakes hold token lists",
        "F1": "scheduler, not the prefix cache", "F2": "scheduler, not the prefix cache",
        "R1": "runner processes, not the prefix cache",
    }

    # On a "-draft" layout the trie keys pack (token i, token i+1): two streams sharing a non-causal item and
    # differing in the token right after it branch at the item's last slot, strictly inside it. M2 is judged there
    # on its capture clause alone: its predicate on the view without the nodes (PARTIAL, set per layout).
    DRAFT_PARTIAL_WHY = {
        "M2": "judged on its capture clause only (scheduled captures): with pair keys, streams that share a "
              "non-causal item and differ right after it branch at the item's last slot, a split the keys force "
              "(KV halves of rows the whole item wrote, no capture), which the node clause would read as a "
              "capture inside the item; M3 still keeps resumes out",
    }

    wire = staticmethod(wire_key)

    def __init__(self, exe, layout: str = "recurrent", budget: int = 1 << 40, interval: int = 8,
                 near_end: int = 4, chunk: int = 8, name: str = "ollama"):
        self.exe, self.name = str(exe), name
        self.config = dict(layout=layout, budget=budget, interval=interval, near_end=near_end, chunk=chunk)
        self._partial_for(layout)
        self.proc = None
        self.sent: list = []          # operations since the last reset (what a crash report keeps)
        self.raw: dict | None = None
        self.merges: list = []
        self.steps = 0                # operations answered, for throughput figures

    def _partial_for(self, layout: str) -> None:
        """PARTIAL of this layout: on a -draft one, M2 is judged on the view without its nodes."""
        self.PARTIAL = {"M2": without_nodes} if "-draft" in layout else None

    @property
    def pairs(self) -> bool:
        """The views' keys are token pairs (a "-draft" layout): their trie shape is not the spec's."""
        return "-draft" in self.config["layout"]

    # ------------------------------------------------------------- process
    def _start(self) -> None:
        env = dict(os.environ, PREFIX_HARNESS="1")
        self.proc = subprocess.Popen([self.exe, "-test.run", "^TestPrefixHarness$"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
                                     bufsize=1)

    def _send(self, op: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.sent.append(op)
        try:
            self.proc.stdin.write(json.dumps(op) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError) as e:
            raise HarnessCrash(f"harness died: {e}") from None
        if not line.startswith("{"):
            err = self.proc.stderr.read() if self.proc.poll() is not None else ""
            tail = (err.strip().splitlines() or [line.strip() or "no answer"])[0]
            self.proc = None
            raise HarnessCrash(f"harness died on {op['op']}: {tail}")
        ans = json.loads(line)
        self.steps += 1
        if not ans.get("ok"):
            if "panic" in ans:
                raise TargetPanic(ans["panic"])
            raise HarnessCrash(f"harness refused {op['op']}: {ans.get('error')}")
        self.raw = ans["view"]
        self.merges = ans.get("merges") or []
        self.outcome = ans.get("outcome")
        return ans

    # ------------------------------------------------------------- Target
    def reset(self, **config) -> None:
        self.config.update(config)
        self._partial_for(self.config["layout"])
        self.sent = []
        self._send(dict(op="reset", cost=COST, **self.config))

    def begin(self, keys, spans=()) -> tuple:
        ans = self._send(dict(op="begin", keys=[wire_key(k) for k in keys], spans=[list(s) for s in spans]))
        self.outcome = tuple(ans["outcome"])
        return self.outcome

    def prefill(self, max_chunks: int | None = None) -> bool:
        return bool(self._send(dict(op="prefill", max_chunks=max_chunks or 0))["outcome"][0])

    def step(self, key: int) -> None:
        self._send(dict(op="step", key=wire_key(key)))

    def close(self) -> None:
        self._send(dict(op="close"))

    def set_budget(self, budget: int) -> None:
        self.config["budget"] = budget
        self._send(dict(op="set_budget", budget=budget))

    def view(self) -> View:
        return view_of(self.raw)

    def shutdown(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except Exception:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
