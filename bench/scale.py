"""python -m bench.scale: TTFT, prefilled tokens, peak memory and bytes held at realistic sizes.

Random-weight models built from a config, saved in mlx-lm's format and loaded back through its
loader (``mlx_lm.utils.load_model``), like impl/models/hybrid.py at full size:
  qwen3next  ~1.3B hybrid (../shared/DEVICE.md): hidden 2048, 24 layers, full attention every 4th
             layer (gated delta elsewhere), dense MLP
  llama      ~1.3B pure attention: hidden 2048, 24 layers, 16 heads, 4 KV heads, MLP 6656 (1.33B)
  --smoke    hidden 64, 4 layers, a ~600-token chat: seconds on the CPU (tests/test_bench_smoke.py)
  --layers N the size's layer count replaced (a model of its own, cached apart)
Vocabulary 49152 (SmolLM2's tokenizer decodes the answers).

Workload (``--context 8k|32k``): a shared system prompt (1/4 of the context), C conversations (3),
T turns each (3), one user message per turn sized so a conversation's last prompt reaches the
context, 16-token greedy answers that go back into the next turn's prompt; turns interleaved across
conversations (c1 t1, c2 t1, c3 t1, c1 t2, ...). Message ends are passed as boundaries where the
engine takes them. Runners (bench/runners.py, bench/limit.py, bench/server_lru.py):
  ours    impl.engine.Engine (the trie), budget --budget-gib, chunk --chunk, capture interval 1024
  limit   each of ours' requests again: a stock mlx-lm cache prepared (untimed) with the prefix ours
          resumed from, then the forwards ours ran and the first token timed; reports TTFT ours /
          limit per request (median, p90, max). Needs ours in the same run (added when not named).
  server  mlx-lm's LRUPromptCache as mlx_lm.server uses it (segment checkpoints, size 10)
  none    no cache: every prompt prefilled from 0
Each runner first serves one warm-up request on a throw-away instance (kernel compilation excluded),
then the workload on a fresh instance after mx.reset_peak_memory(). Per runner: requests, prefilled
tokens, TTFT (sum / median / max), peak MLX memory (and above the weights), bytes held at the end.
Python's full collections run as in a runner (serve/collector.py): never inside a request, only
between two (every runner alike); the model's objects are frozen after the load, as impl.models.load's.
Writes DIR/scale-<arch>-<size>-<context>.json and .md; split long runs with --runner.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

VOCAB = 49152
BASE = {
    "qwen3next": {"model_type": "qwen3_next", "num_attention_heads": 16, "num_key_value_heads": 2,
                  "head_dim": 128, "linear_num_value_heads": 16, "linear_num_key_heads": 8,
                  "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
                  "num_experts": 0, "num_experts_per_tok": 1, "decoder_sparse_step": 1,
                  "shared_expert_intermediate_size": 0, "mlp_only_layers": [], "moe_intermediate_size": 0,
                  "rms_norm_eps": 1e-6, "rope_theta": 10_000.0, "partial_rotary_factor": 0.25,
                  "tie_word_embeddings": True, "full_attention_interval": 4},
    "llama": {"model_type": "llama", "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
              "rms_norm_eps": 1e-5, "rope_theta": 500_000.0, "tie_word_embeddings": True,
              "intermediate_size": 6656},                                     # 1.33B at 1.3b
}
SIZES = {"1.3b": {"hidden_size": 2048, "num_hidden_layers": 24, "intermediate_size": 5632},   # qwen3next 1.32B
         "smoke": {"hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128}}
SMOKE_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_num_value_heads": 4,
               "linear_num_key_heads": 2, "linear_key_head_dim": 16, "linear_value_head_dim": 16}
CONTEXTS = {"smoke": 600, "8k": 8192, "32k": 32768}
RUNNERS = ("ours", "limit", "server", "none")


def config(arch: str, size: str, layers: int | None = None) -> dict:
    c = {**SIZES[size], **BASE[arch], "vocab_size": VOCAB, "max_position_embeddings": 65536}
    if layers is not None:
        c["num_hidden_layers"] = layers
    if size != "1.3b":
        c["intermediate_size"] = SIZES[size]["intermediate_size"]
    if size == "smoke":
        c.update({k: v for k, v in SMOKE_HEADS.items() if k in c})
        if arch == "qwen3next":
            c["full_attention_interval"] = 2
    return c


def size_label(size: str, layers: int | None = None) -> str:
    """The size's name in model directories and reports: with --layers, the count too."""
    return size if layers is None else f"{size}-{layers}layers"


def model_dir(arch: str, size: str, dtype: str, layers: int | None = None) -> Path:
    from impl.models.hybrid import cache_root
    return cache_root() / f"scale-{arch}-{size_label(size, layers)}-{dtype}-v1"


def build(arch: str, size: str, dtype: str = "float32", layers: int | None = None):
    """Generate (once) and load through mlx-lm's loader; returns an impl.models.LoadedModel."""
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes, load_model

    from impl.caches import layer_kinds, make_layer_caches
    from impl.memory import release_pool
    from impl.models import LoadedModel, shared_tokenizer

    path = model_dir(arch, size, dtype, layers)
    if not (path / "config.json").exists():
        cfg = config(arch, size, layers)
        model_class, args_class = _get_classes(config=cfg)
        mx.random.seed(20261203)
        model = model_class(args_class.from_dict(cfg))
        weights = {k: v.astype(getattr(mx, dtype)) for k, v in tree_flatten(model.parameters())}
        path.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
        del model, weights
        (path / "config.json").write_text(json.dumps(cfg, indent=2))
    model, cfg = load_model(path)
    model.eval()
    mx.eval(model.parameters())
    params = tree_flatten(model.parameters())
    lm = LoadedModel(name=f"scale-{arch}-{size}", model=model, tokenizer=shared_tokenizer(),
                     n_params=sum(v.size for _, v in params), weight_bytes=sum(v.nbytes for _, v in params),
                     context_length=65536, vocab_size=VOCAB, layer_kinds=layer_kinds(make_layer_caches(model)),
                     dtype=dtype)
    release_pool()
    return lm


def workload(context: int, conversations: int = 3, turns: int = 3, answer: int = 16, seed: int = 0):
    """System prompt and user messages (token ids): the plan the runners follow."""
    rng = np.random.default_rng(seed)
    system = rng.integers(1000, VOCAB, context // 4).tolist()
    user_len = max(8, (context - len(system)) // turns - answer - 1)
    users = [[rng.integers(1000, VOCAB, user_len).tolist() for _ in range(turns)] for _ in range(conversations)]
    return system, users, answer


def serve(runner, system, users, answer, prompts: list | None = None, between=None) -> list:
    """Turn-major over the conversations; each conversation carries its own answers. ``prompts``, when
    given, receives every prompt served (the limit runner replays ours'); ``between()`` runs after each
    request (a runner's idle moment: serve/collector.py)."""
    history = [list(system) for _ in users]
    bounds = [[len(system)] for _ in users]
    rows = []
    for t in range(len(users[0])):
        for c, msgs in enumerate(users):
            prompt = history[c] + msgs[t]
            b = bounds[c] + [len(prompt)]
            out = runner.run(prompt, answer, boundaries=b[:-1], sys_end=len(system))
            rows.append({"conv": c, "turn": t, "prompt": len(prompt), "prefilled": out.prefilled,
                         "ttft_s": out.ttft_s, "total_s": out.total_s, "resumed": out.resumed,
                         "forward_s": out.forward_s, "bookkeeping_s": out.bookkeeping_s,
                         "ttft_forward_s": out.ttft_forward_s, "ttft_bookkeeping_s": out.ttft_bookkeeping_s,
                         "chunks": [list(x) for x in out.chunks], "first": out.tokens[0] if out.tokens else None})
            if prompts is not None:
                prompts.append(prompt)
            history[c] = prompt + list(out.tokens)
            bounds[c] = b + [len(history[c])]
            if between is not None:
                between()
    return rows


def make_runner(kind: str, lm, args):
    from bench.runners import NoCache, Ours
    from bench.server_lru import ServerLRU

    if kind == "ours":
        return Ours(lm, int(args.budget_gib * (1 << 30)), chunk=args.chunk, interval=args.interval, near_end=4)
    if kind == "server":
        return ServerLRU(lm, chunk=args.chunk)
    return NoCache(lm, chunk=args.chunk)


def measure(kind: str, lm, args, plan, prompts: list | None = None, between=None) -> dict:
    system, users, answer = plan
    warm = make_runner(kind, lm, args)
    rng = np.random.default_rng(99)
    warm.run(rng.integers(1000, VOCAB, min(len(system), 2 * args.chunk + 7)).tolist(), 2, sys_end=0)
    warm.close()
    mx.clear_cache()
    runner = make_runner(kind, lm, args)
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    rows = serve(runner, system, users, answer, prompts, between)
    wall = time.perf_counter() - t0
    peak, held = mx.get_peak_memory(), runner.held()
    runner.close()
    mx.clear_cache()
    ttft = [r["ttft_s"] for r in rows]
    forward = sum(r["forward_s"] for r in rows)
    return {"runner": kind, "requests": len(rows), "prompt_tokens": sum(r["prompt"] for r in rows),
            "prefilled": sum(r["prefilled"] for r in rows), "ttft_sum_s": sum(ttft),
            "ttft_median_s": statistics.median(ttft), "ttft_max_s": max(ttft), "wall_s": wall,
            "bookkeeping_over_forward": sum(r["bookkeeping_s"] for r in rows) / forward if forward else None,
            "peak_bytes": peak, "peak_above_weights": peak - lm.weight_bytes, "held_bytes": held, "rows": rows}


def markdown(rep: dict) -> str:
    g, m = 1 << 30, 1 << 20
    lines = [f"### {rep['arch']} {rep['size']} ({rep['params'] / 1e9:.2f}B params, {rep['dtype']}), context "
             f"{rep['context']}, device {rep['device']}", "",
             f"{rep['conversations']} conversations x {rep['turns']} turns on a {rep['system']}-token system "
             f"prompt; chunk {rep['chunk']}; warm-up excluded.", "",
             "| runner | requests | prompt tokens | prefilled | TTFT sum | TTFT median | TTFT max | peak MLX "
             "| peak above weights | bytes held | bookkeeping / forward |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rep["runners"]:
        peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / g:.2f} GiB"
        above = "-" if r["peak_above_weights"] is None else f"{r['peak_above_weights'] / m:.1f} MiB"
        bk = r.get("bookkeeping_over_forward")
        lines.append(f"| {r['runner']} | {r['requests']} | {r['prompt_tokens']} | {r['prefilled']} | "
                     f"{r['ttft_sum_s']:.2f} s | {r['ttft_median_s']:.3f} s | {r['ttft_max_s']:.2f} s | "
                     f"{peak} | {above} | {r['held_bytes'] / m:.1f} MiB | {'-' if bk is None else f'{bk:.2%}'} |")
    lim = next((r for r in rep["runners"] if r["runner"] == "limit"), None)
    if lim is not None:
        x = lim["ttft_over_limit"]
        lines += ["", "TTFT ours / limit per request (bench/limit.py; floor: <= 1.10 median, <= 1.25 p90):", "",
                  "| median | p90 | max | first token equal | limit's untimed preparation |", "|---|---|---|---|---|",
                  f"| {x['median']:.3f} | {x['p90']:.3f} | {x['max']:.3f} | {lim['same_first_token']} of "
                  f"{lim['requests']} | {lim['prep_s']:.1f} s |"]
        gap = x.get("gap_s")
        if gap:
            lines += ["", f"Ours' TTFT over the limit's, summed over the requests: {gap['total'] * 1e3:.1f} ms = "
                          f"forwards {gap['forward'] * 1e3:.1f} ms (ours' against the limit's) + bookkeeping "
                          f"{gap['bookkeeping'] * 1e3:.1f} ms + other {gap['other'] * 1e3:.1f} ms (checks, "
                          "reservation, sampling, the engine's steps between forwards)."]
    return "\n".join(lines) + "\n"


def runner_order(kinds) -> list:
    """The runners to measure, in order: ours before limit (the limit replays ours' requests)."""
    kinds = list(dict.fromkeys(kinds or RUNNERS))
    if "limit" in kinds:
        kinds.remove("limit")
        if "ours" not in kinds:
            kinds.insert(0, "ours")
        kinds.insert(kinds.index("ours") + 1, "limit")
    return kinds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    p.add_argument("--arch", action="append", choices=sorted(BASE), help="default: both")
    p.add_argument("--size", choices=sorted(SIZES), default="1.3b")
    p.add_argument("--context", choices=sorted(CONTEXTS), default="8k")
    p.add_argument("--smoke", action="store_true", help="--size smoke --context smoke (seconds on a CPU)")
    p.add_argument("--runner", action="append", choices=RUNNERS,
                   help="default: all four; limit runs ours first if it is not named")
    p.add_argument("--conversations", type=int, default=3)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--interval", type=int, default=1024)
    p.add_argument("--budget-gib", type=float, default=8.0)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--layers", type=int, help="the size's layer count replaced (the smoke model at 1.3B's 24 "
                   "layers: the bookkeeping's Python at scale on a CPU; bench.pagein_split --stream-copies)")
    p.add_argument("--report", type=Path, default=Path("reports/scale"))
    a = p.parse_args(argv)
    if a.smoke:
        a.size, a.context, a.chunk, a.interval = "smoke", "smoke", 64, 128
    from bench import limit
    from fuzz.calibrate import device_key
    from serve.collector import IdleCollector

    a.report.mkdir(parents=True, exist_ok=True)
    for arch in a.arch or sorted(BASE):
        t0 = time.perf_counter()
        lm = build(arch, a.size, a.dtype, a.layers)
        load_s = time.perf_counter() - t0
        gc.collect()
        gc.freeze()                  # the model's objects live as long as it (impl.models.load does the same)
        plan = workload(CONTEXTS[a.context], a.conversations, a.turns)
        rep = {"arch": arch, "size": a.size, "layers": a.layers, "dtype": a.dtype, "params": lm.n_params,
               "context": a.context,
               "device": device_key(), "conversations": a.conversations, "turns": a.turns,
               "system": len(plan[0]), "chunk": a.chunk, "load_s": round(load_s, 1), "runners": []}
        ours, prompts, collector = None, [], IdleCollector().install()
        try:
            for kind in runner_order(a.runner):
                if kind == "limit":
                    warm = np.random.default_rng(98).integers(1000, VOCAB, min(len(plan[0]), 2 * a.chunk + 7))
                    r = limit.measure(lm, ours, prompts, chunk=a.chunk, warm_prompt=warm.tolist(), between=collector.idle)
                else:
                    r = measure(kind, lm, a, plan, prompts if kind == "ours" else None, collector.idle)
                    ours = r if kind == "ours" else ours
                rep["runners"].append(r)
                print(f"{arch} {a.size} {a.context} {kind:6s}: prefilled {r['prefilled']:6d}  TTFT sum "
                      f"{r['ttft_sum_s']:.2f}s median {r['ttft_median_s']:.3f}s", end="", flush=True)
                if kind == "limit":
                    x = r["ttft_over_limit"]
                    print(f"  ours/limit median {x['median']:.3f} p90 {x['p90']:.3f} max {x['max']:.3f}", flush=True)
                else:
                    print(f"  peak {r['peak_bytes'] / 2**30:.2f} GiB  held {r['held_bytes'] / 2**30:.3f} GiB", flush=True)
        finally:
            collector.uninstall()
        rep["gc"] = collector.stats()        # full collections run between requests (none inside one)
        stem = str(a.report / f"scale-{arch}-{size_label(a.size, a.layers)}-{a.context}") + ("-" + "-".join(a.runner) if a.runner else "")
        Path(f"{stem}.json").write_text(json.dumps(rep, indent=1))
        Path(f"{stem}.md").write_text(markdown(rep))
        print(markdown(rep))
        del lm
        mx.clear_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
