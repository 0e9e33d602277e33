"""check-sglang's targets for the hybrid caches: `--cache mamba` (MambaRadixCache, targets.sglang.mamba)
and `--cache unified` (UnifiedRadixCache, targets.sglang.unified), on the sglang of --src / --release /
the installed one, or on their planted-fault fakes with --fixture FAULT (no sglang needed)."""
from __future__ import annotations

COMPONENTS = ("full,mamba", "full,swa", "full,swa,mamba")


def make_hybrid(a, release_dir):
    """(target, description) for a.cache in ("mamba", "unified")."""
    src = a.src or (str(release_dir(a.release)) if a.release else None)
    if a.cache == "mamba":
        from targets.sglang.mamba import MambaTarget
        if a.fixture:
            from targets.sglang.fixture_mamba import FakeMambaApi
            return MambaTarget(FakeMambaApi(None if a.fixture == "none" else a.fixture)), \
                f"Mamba fixture ({a.fixture})"
        from targets.sglang import engine
        from targets.sglang.mamba import load_mamba
        api = load_mamba(src)
        return MambaTarget(api), f"sglang {engine.version(engine.load(src))} MambaRadixCache"
    comps = getattr(a, "components", "full,mamba")
    if comps not in COMPONENTS:
        raise RuntimeError(f"--components {comps}: one of {', '.join(COMPONENTS)}")
    if "swa" in comps:
        return unified_swa(a, src, comps)
    from targets.sglang.unified import UnifiedTarget, load_unified
    if a.fixture:
        from targets.sglang.fixture_unified import FakeUnifiedApi
        return UnifiedTarget(FakeUnifiedApi(None if a.fixture == "none" else a.fixture)), \
            f"unified fixture ({a.fixture})"
    from targets.sglang import engine
    from targets.sglang.unified_legacy import LegacyUnifiedTarget, has_legacy_unified, load_legacy_unified
    if has_legacy_unified(src):                  # 0.5.15: cache_*_req, no checkpoint
        return LegacyUnifiedTarget(load_legacy_unified(src)), \
            f"sglang {engine.version(engine.load(src))} UnifiedRadixCache (cache_*_req)"
    api = load_unified(src)
    return UnifiedTarget(api), f"sglang {engine.version(engine.load(src))} UnifiedRadixCache"


def unified_swa(a, src, comps: str):
    """`--cache unified --components full,swa[,mamba]`: targets.sglang.unified_swa (0.5.23)."""
    from targets.sglang.unified_swa import UnifiedSwaTarget, load_unified_swa
    if a.fixture:
        if "mamba" in comps:
            raise RuntimeError("the unified SWA fixture has Full + SWA only (--components full,swa)")
        from targets.sglang.fixture_unified_swa import FakeUnifiedSwaApi
        return UnifiedSwaTarget(FakeUnifiedSwaApi(None if a.fixture == "none" else a.fixture)), \
            f"unified SWA fixture ({a.fixture})"
    from targets.sglang import engine
    api = load_unified_swa(src, mamba="mamba" in comps)
    if not hasattr(api.mod.UnifiedRadixCache, "checkpoint"):
        raise RuntimeError("--components with swa drives 0.5.23's UnifiedRadixCache (checkpoint); this one has none")
    return UnifiedSwaTarget(api), f"sglang {engine.version(engine.load(src))} UnifiedRadixCache ({comps.upper()})"
