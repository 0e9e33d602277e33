"""Format the benchmark figures: a plain-text table for the terminal, markdown for reports/, a PNG chart."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

MB = 1 << 20


def _kb(x) -> str:
    return "–" if x is None else f"{x / 1024:.1f}"


def _mb(x) -> str:
    return "–" if x is None else f"{x / MB:.1f}"


def _r(x, d=2) -> str:
    return "–" if x is None else f"{x:.{d}f}"


COLUMNS = [
    ("workload", lambda r: r["workload"]),
    ("model", lambda r: r["model"]),
    ("budget", lambda r: "ample" if r["budget"] == "ample" else f"tight {_kb(r['budget_bytes'])} KB"),
    ("req", lambda r: str(r["requests"])),
    ("prefilled ours / LRU / none / ideal (@capt)", lambda r: f"{r['prefilled_ours']} / {r['prefilled_lru']} / "
     f"{r['prefilled_none']} / {r['prefilled_ideal']}"
     + (f" ({r['prefilled_ideal_cp']})" if r.get("prefilled_ideal_cp") is not None else "")),
    ("TTFT ours/LRU", lambda r: _r(r["ttft_ours_lru"])),
    ("TTFT ours/none", lambda r: _r(r["ttft_ours_none"])),
    ("peak MB ours / LRU / none", lambda r: f"{_mb(r['peak_ours'])} / {_mb(r['peak_lru'])} / {_mb(r['peak_none'])}"),
    ("held KB ours / LRU", lambda r: f"{_kb(r['held_ours'])} / {_kb(r['held_lru'])}"),
    ("B/token ours / LRU (raw KV)", lambda r: f"{_kb(r['bpt_ours'])} / {_kb(r['bpt_lru'])} ({_kb(r['raw_kv_per_token'])}) KB"),
    ("bookkeeping / forward", lambda r: "–" if r["bk_frac"] is None else f"{100 * r['bk_frac']:.2f}%"),
    ("lazy views step ratio", lambda r: _r(r.get("lazy_ratio"), 3)),
    ("max matched-resume", lambda r: "–" if r.get("gap_max_ours") is None else str(r["gap_max_ours"])),
    ("evictions ours / nodes / LRU entries", lambda r: f"{r['evictions_ours']} / {r['nodes_ours']} / {r['entries_lru']}"),
]


def table_rows(rows: list) -> list:
    return [[f(r) for _, f in COLUMNS] for r in rows]


def text_table(rows: list) -> str:
    head = [h for h, _ in COLUMNS]
    body = table_rows(rows)
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(b) for b in body])


def markdown_table(rows: list) -> str:
    head = [h for h, _ in COLUMNS]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(b) + " |" for b in table_rows(rows)]
    return "\n".join(out)


def machine() -> dict:
    import mlx.core as mx

    try:
        import importlib.metadata as md
        mlx_v, lm_v = md.version("mlx"), md.version("mlx-lm")
    except Exception:  # noqa: BLE001
        mlx_v, lm_v = getattr(mx, "__version__", "?"), "?"
    mem = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
    except OSError:
        pass
    try:
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    blas = os.environ.get("LD_PRELOAD", "") or "none preloaded"
    blas += "".join(f", {k}={os.environ[k]}" for k in ("OPENBLAS_THREAD_TIMEOUT", "OPENBLAS_NUM_THREADS")
                    if k in os.environ)
    try:
        cpu = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    except OSError:
        cpu = str(os.cpu_count())
    return {"nproc": cpu, "memory": mem, "mlx": mlx_v, "mlx_lm": lm_v, "python": platform.python_version(),
            "platform": platform.platform(), "load": load, "blas": blas, "device": str(mx.default_device())}


def chart(rows: list, path: Path) -> int:
    """Prefilled tokens (normalised to no cache) and TTFT ratios per row; returns the file size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['workload']}\n{r['model']}\n{r['budget']}" for r in rows]
    xs = range(len(rows))
    fig, (a, b) = plt.subplots(2, 1, figsize=(11, 6), dpi=72, sharex=True)
    w = 0.2
    series = [("ours", "prefilled_ours", "#1f77b4"), ("LRUPromptCache", "prefilled_lru", "#ff7f0e"),
              ("ideal", "prefilled_ideal", "#2ca02c"), ("ideal @ captures", "prefilled_ideal_cp", "#98df8a")]
    for k, (name, key, color) in enumerate(series):
        ys = [(r[key] if r.get(key) is not None else 0) / r["prefilled_none"] for r in rows]
        a.bar([x + (k - 1.5) * w for x in xs], ys, w, label=name, color=color)
    a.set_ylabel("prefilled / no cache")
    a.legend(fontsize=8, ncol=4)
    a.set_title("Prompt tokens evaluated (lower is better; 1.0 = no cache)")
    b.bar([x - w / 2 for x in xs], [r["ttft_ours_lru"] for r in rows], w, label="TTFT ours / LRU", color="#9467bd")
    b.bar([x + w / 2 for x in xs], [r["ttft_ours_none"] for r in rows], w, label="TTFT ours / none", color="#8c564b")
    b.axhline(1.0, color="k", lw=0.8)
    b.set_ylabel("median paired ratio")
    b.legend(fontsize=8)
    b.set_xticks(list(xs))
    b.set_xticklabels(labels, fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path.stat().st_size
