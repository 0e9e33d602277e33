"""mlx-lm's save_prompt_cache / load_prompt_cache on our layer caches.

mlx-lm saves each cache's ``state`` under ``type(c).__name__`` and rebuilds it with
``mlx_lm.models.cache.<name>.from_state(state)``, looking the name up in that module's globals.
``register()`` (run when impl.caches is imported) adds our class names there — only names mlx-lm
does not define (our KV class is ``SnapshotKVCache`` for that reason), never replacing one of its
classes — so a file saved from our caches loads back as our classes, and a file saved from
mlx-lm's caches still loads as mlx-lm's.

Invariants:
- ``state`` of every cache is exactly mlx-lm's tuple for the class it subclasses (so mlx-lm code
  reading it works), and ``from_state(state)`` builds a complete cache through ``__init__``
  (mlx-lm's default skips ``__init__``, which would leave the snapshot bookkeeping unset).
- What is saved is the live state only: snapshots are not saved, and a loaded cache has
  ``layer=None`` (its snapshots fit any layer with the same geometry).
"""

from __future__ import annotations

from mlx_lm.models import cache as mlx_cache

from .base import CacheError


def register(*classes) -> None:
    for cls in classes:
        name = cls.__name__
        present = getattr(mlx_cache, name, None)
        if present is not None and present is not cls:
            raise CacheError(f"mlx_lm.models.cache already defines {name}: our class needs another name")
        setattr(mlx_cache, name, cls)
