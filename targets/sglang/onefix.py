"""One bug, one fix: the saved SGLang findings' exported tests on the affected release and on copies of
it, each with only one bug fixed (issue 50).

`SGLANG_PYTHON=... ./dev check-sglang --onefix [--src PATH | --release 0.5.5] [--report DIR]` copies the
release's `sglang` package once per fix into DIR/onefix/<fix>/sglang, applies that fix (exact, unique
substitutions written here: a release whose text differs is refused), exports every saved finding
(targets/sglang/findings/*.json; export_req.py / export_swa.py) into DIR/onefix/tests, runs each
with pytest in a fresh interpreter on the stock release and on every copy (the conftest loads the
radix caches from that directory through targets.sglang.engine, stubs included, and the run checks
the import location), and prints the table docs/peers.md keeps: one row per finding, one column per
source; "fails" = the test's AssertionError, "passes" = the test passed.

The bugs, all in `cache_finished_req` under EAGLE (0.5.5 lines):
- req-leak: `RadixCache` frees the duplicates from `len(req.prefix_indices)` less one (l. 370-374),
  which with page size > 1 is past what the tree protects; the fix frees from
  `req.last_matched_prefix_len`, the length `cache_unfinished_req` and admission record as matched
  (0.5.6 frees from `req.cache_protected_len`, its name for it);
- swa-leak: the same start in `SWARadixCache` (l. 471-475, passed to `insert`, which frees the
  duplicates), fixed the same way here (upstream, 0.5.8 frees a matched duplicate node whole in
  `_insert_helper`; targets/fixcommits.py);
- swa-double-free: with page size 1, `SWARadixCache` frees the last position's slot (l. 465) and then
  the same range again as the unaligned tail (l. 492); the fix drops the first free (0.5.7 drops the
  second, 0.5.8 the first).
Invariant: the expected outcome is the identity; `targets.onefix.check_identity` lists where it is not.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from targets import onefix

FINDINGS = Path(__file__).resolve().parent / "findings"
AFFECTED = "0.5.5"
RADIX, SWA = "srt/mem_cache/radix_cache.py", "srt/mem_cache/swa_radix_cache.py"

_EAGLE_MINUS_ONE = """        old_prefix_len = len(req.prefix_indices)
        if self.is_eagle and old_prefix_len > req.last_matched_prefix_len:
            # In EAGLE chunked prefill case, the prefix_indices included one unmatched token (kv_indices[actual_kv_len:])
            # Here we -1 to make sure the kv of the unmatched token can be freed correctly to avoid memory leak
            old_prefix_len -= 1

        # Radix Cache takes one ref in memory pool
"""
_PROTECTED = """        old_prefix_len = req.last_matched_prefix_len

        # Radix Cache takes one ref in memory pool
"""
_FINISHED_REQ, _FINISHED_SWA = "        if is_insert:\n", "        # insert the token_ids and kv_indices"

# fix -> [(file under sglang/, old text, new text)]; each old text occurs once (cache_finished_req)
FIXES: dict = {
    "req-leak": [(RADIX, _EAGLE_MINUS_ONE + _FINISHED_REQ, _PROTECTED + _FINISHED_REQ)],
    "swa-leak": [(SWA, _EAGLE_MINUS_ONE + _FINISHED_SWA, _PROTECTED + _FINISHED_SWA)],
    "swa-double-free": [(SWA, """            page_aligned_kv_indices = kv_indices.to(dtype=torch.int64, copy=True)
            if self.is_eagle:
                self.token_to_kv_pool_allocator.free(kv_indices[page_aligned_len:])
""", """            page_aligned_kv_indices = kv_indices.to(dtype=torch.int64, copy=True)
""")],
}
FIX_OF = {"A2-req-eagle-page2": "req-leak", "A2-swa-eagle-page2": "swa-leak", "A2-swa-eagle-page1": "swa-double-free"}

CONFTEST = """import os
from pathlib import Path

from targets.sglang.engine import load, load_module

load(os.environ["ONEFIX_SRC"])          # the radix caches from that directory, with the target's stubs
load_module("swa_radix_cache", os.environ["ONEFIX_SRC"])
import sglang  # noqa: E402

Path(os.environ["ONEFIX_FROM"]).write_text(os.path.dirname(os.path.realpath(sglang.__file__)))
"""


def findings(directory: Path = FINDINGS) -> dict:
    """{finding stem: record}; every finding must name its fix in FIX_OF."""
    recs = {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}
    for stem in recs:
        if FIX_OF.get(stem) not in FIXES:
            raise ValueError(f"finding {stem}: no fix named for it in targets/sglang/onefix.py FIX_OF")
    return recs


def tests(recs: dict, where: Path) -> dict:
    """Each finding's exported module in `where`; {stem: FILE} (every test in it)."""
    from targets.sglang import export_req, export_swa
    out = {}
    for stem, rec in recs.items():
        ex = export_swa if rec["cache"] == "swa" else export_req
        name = f"test_{stem.lower().replace('-', '_')}.py"
        (where / name).write_text(ex.export(rec["rule"], f"sglang {rec['found_on']}", rec["message"], rec["ops"],
                                            rec["page_size"], eagle=rec.get("eagle", False)))
        out[stem] = name
    return out


def main(root: str, src: str) -> int:
    from targets.sglang.engine import sglang_root
    root, recs, src = Path(root), findings(), sglang_root(src)
    where = onefix.prepare(root / "tests", CONFTEST)
    cols = {"stock": src}
    try:
        cols.update({fix: onefix.build(src, "sglang", root / fix, edits) for fix, edits in FIXES.items()})
    except (ValueError, FileNotFoundError) as e:     # a release whose text differs: no copy, no table
        print(f"onefix: {e} (the fixes are written for sglang {AFFECTED})", file=sys.stderr)
        return 2
    tab = onefix.table(tests(recs, where), where, cols, "sglang")
    print(onefix.markdown(tab))
    bad = onefix.check_identity(tab, {stem: FIX_OF[stem] for stem in recs})
    print("identity: yes" if not bad else f"not the identity at {bad}")
    return int(bool(bad))
