"""The vLLM target: vLLM v1's prefix cache (KVCacheManager, its coordinator, the single-type managers
for full attention, sliding window and Mamba, and BlockPool) driven as its scheduler drives it, with
no model and no GPU, judged by spec.rules on a block-unit view.

Modules:
  stubs     stand-ins for serving-stack packages the managers import but never call
  engine    vLLM's own objects built as its unit tests build them (installed package or --src)
  adapter   VllmTarget: the target interface of targets/base.py; content tags play the forward
  view      the pool's hash map as spec.view's View, in blocks
  rules     which rules apply (RULES, NOT_APPLICABLE) and the vLLM functions violations point at
  fake      a small manager with vLLM's call surface and planted faults (CI, no vLLM needed)
  export    a finding as a pytest test against vLLM's public API
  __main__  ./dev check-vllm: check, replay over releases or commits
"""
CHECKED = "0.33.0"
