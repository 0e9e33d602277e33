"""The merge of `python -m targets.watch merge DIR|FILE... --out OUT [--expect a,b,...]`.

Each input is a result.json of format prefix-trie-peer-watch/1 (`python -m targets.watch run|failed`
writes one per target) or a directory holding one (an artifact of the nightly's `peers` job). OUT gets
summary.json (format prefix-trie-peer-watch-merged/1) and summary.md, in three parts:
  - new findings: hunt violations breaking a rule no saved finding of that target breaks, with their
    program files (in the target's artifact);
  - saved findings that stopped reproducing: "fixed upstream in <peer version or commit>" (those the
    finding already records as fixed, vLLM's `fixed_on`, in one line apart; one of those reproducing
    again is listed as a regression);
  - targets that failed to install or run, with the reason (a target named by --expect with no result
    at all counts: its job ended before writing one).
Then a row per target: peer version, hunt, saved findings reproducing / stopped / not judged.

Standard library only. Exit status: 0 every target ran; 1 a target failed (the summary is written);
2 bad input (a missing file, not JSON, another format, a field missing), naming the file.
"""
from __future__ import annotations

import json
from pathlib import Path

FORMAT = "prefix-trie-peer-watch/1"
MERGED = "prefix-trie-peer-watch-merged/1"
STATUSES = ("reproduces", "stopped", "error")


class MergeError(Exception):
    """Input the merge cannot read; the message names the file and says why."""


def load_result(path: Path) -> dict:
    """One target's result, checked for what the merge reads."""
    f = path / "result.json" if path.is_dir() else path
    if not f.exists():
        raise MergeError(f"{path}: no such file" if not path.is_dir() else
                         f"{path}: no result.json in it (`python -m targets.watch run` writes one)")
    try:
        rec = json.loads(f.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise MergeError(f"{f}: not JSON ({e})") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        got = rec.get("format") if isinstance(rec, dict) else type(rec).__name__
        raise MergeError(f"{f}: format {got!r}, expected {FORMAT!r} (a peer watch result)")
    for key, kind in (("target", str), ("status", str), ("peer", dict), ("new", list), ("known", list),
                      ("saved", list)):
        if not isinstance(rec.get(key), kind):
            raise MergeError(f"{f}: field {key!r} missing or not a {kind.__name__}")
    if rec["status"] not in ("ok", "failed"):
        raise MergeError(f"{f}: status {rec['status']!r}, expected 'ok' or 'failed'")
    for s in rec["saved"]:
        if not (isinstance(s, dict) and isinstance(s.get("finding"), str) and s.get("status") in STATUSES):
            raise MergeError(f"{f}: a saved entry {s!r} lacks a finding name or a status of {STATUSES}")
    for v in rec["new"] + rec["known"]:
        if not (isinstance(v, dict) and isinstance(v.get("rule"), str)):
            raise MergeError(f"{f}: a violation {v!r} has no rule")
    rec["_file"] = str(f)
    return rec


def merge(results: list[dict], expect: list[str]) -> dict:
    targets = {}
    for r in results:
        if r["target"] in targets:
            raise MergeError(f"{r['_file']}: a second result for {r['target']} (first: {targets[r['target']]['_file']})")
        targets[r["target"]] = r
    for name in expect:
        if name not in targets:
            targets[name] = {"target": name, "status": "failed", "peer": {"version": "?"}, "hunt": None,
                             "reason": "no result uploaded (the job ended before writing one)",
                             "new": [], "known": [], "saved": [], "_file": None}
    new, stopped, still_fixed, again, failed, errors, rows = [], [], [], [], [], [], []
    for name in sorted(targets):
        r = targets[name]
        version = r["peer"].get("version", "?")
        new += [dict(v, target=name, version=version) for v in r["new"]]
        stopped += [dict(s, target=name, fixed_in=version) for s in r["saved"]
                    if s["status"] == "stopped" and not s.get("recorded_fixed")]
        still_fixed += [dict(s, target=name) for s in r["saved"]
                        if s["status"] == "stopped" and s.get("recorded_fixed")]
        again += [dict(s, target=name, version=version) for s in r["saved"]
                  if s["status"] == "reproduces" and s.get("recorded_fixed")]
        errors += [dict(s, target=name) for s in r["saved"] if s["status"] == "error"]
        if r["status"] == "failed":
            failed.append({"target": name, "version": version, "reason": r.get("reason") or "no reason given"})
        h = r.get("hunt") or {}
        count = {k: sum(s["status"] == k for s in r["saved"]) for k in STATUSES}
        rows.append({"target": name, "status": r["status"], "version": version,
                     "source": r["peer"].get("source", ""), "hunt_minutes": h.get("minutes"),
                     "violations": h.get("violations"), "new": len(r["new"]), "known": len(r["known"]),
                     "saved": len(r["saved"]), **count})
    return {"format": MERGED, "new": new, "stopped": stopped, "still_fixed": still_fixed, "again": again,
            "failed": failed, "not_judged": errors, "targets": rows}


def markdown(m: dict) -> str:
    md = ["# Peer watch", ""]
    md += ["## New findings", ""]
    md += [f"- **{v['target']}** {v['version']}: {v['rule']} `{v.get('name', '')}` "
           f"({v.get('program', 'no program file')}): {v.get('message', '')}".rstrip(": ") for v in m["new"]] or ["None."]
    md += ["", "## Saved findings that stopped reproducing", ""]
    md += [f"- **{s['target']}** `{s['finding']}` ({s.get('rule', '?')}): fixed upstream in {s['target']} "
           f"{s['fixed_in']}" + (f" -- {s['detail']}" if s.get("detail") else "") for s in m["stopped"]] or ["None."]
    if m["still_fixed"]:
        md += ["", "Still fixed (recorded fixed upstream before): " + ", ".join(
            f"{s['target']} `{s['finding']}` (fixed in {s['recorded_fixed']})" for s in m["still_fixed"]) + "."]
    if m["again"]:
        md += ["", "## Recorded fixed, reproducing again", ""]
        md += [f"- **{s['target']}** `{s['finding']}` ({s.get('rule', '?')}): recorded fixed in "
               f"{s['recorded_fixed']}, reproduces on {s['version']}" for s in m["again"]]
    md += ["", "## Targets that failed to install or run", ""]
    md += [f"- **{f['target']}** ({f['version']}): {f['reason']}" for f in m["failed"]] or ["None."]
    if m["not_judged"]:
        md += ["", "## Saved findings not judged", ""]
        md += [f"- **{s['target']}** `{s['finding']}`: {s.get('detail', '')}" for s in m["not_judged"]]
    md += ["", "## Per target", "",
           "| target | status | peer | hunt min | violations (new / known) | saved: reproduce / stopped / not judged |",
           "|---|---|---|---|---|---|"]
    for r in m["targets"]:
        hunt = "-" if r["hunt_minutes"] is None else f"{r['hunt_minutes']:g}"
        viol = "-" if r["violations"] is None else f"{r['violations']} ({r['new']} / {r['known']})"
        md.append(f"| {r['target']} | {r['status']} | {r['version']} {('(' + r['source'] + ')') if r['source'] else ''} "
                  f"| {hunt} | {viol} | {r['reproduces']} / {r['stopped']} / {r['error']} of {r['saved']} |")
    return "\n".join(md) + "\n"


def merge_main(a) -> int:
    expect = [x for x in a.expect.split(",") if x]
    m = merge([load_result(Path(p)) for p in a.inputs], expect)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(m, indent=1))
    (out / "summary.md").write_text(markdown(m))
    print(f"peer watch: {len(m['targets'])} targets, {len(m['new'])} new findings, {len(m['stopped'])} saved "
          f"findings stopped, {len(m['failed'])} targets failed; {out / 'summary.md'}")
    return 1 if m["failed"] else 0
