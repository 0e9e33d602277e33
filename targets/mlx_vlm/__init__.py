"""The mlx-vlm target: mlx-vlm's automatic prefix cache (`mlx_vlm.apc`), driven the way its server drives it.

Checked against mlx-vlm 0.7.10 (the findings record the version they were found on), in its own venv
(targets/mlx_vlm/install.sh; MLXVLM_PYTHON). mlx-vlm is imported, never copied: the driver calls its
own `apc.from_env`, `BatchGenerator`, `semantic_extra_hash` and model loader.

Modules:
  models    small fixed-seed qwen2_vl and qwen3_5 models saved in mlx-vlm's format and loaded by its
            loader; the image and video processors; key streams as prompt ids and images or clips
  driver    ServerDriver: one request as the server's worker runs it; the record of block contents
  target    MlxVlmTarget: the same behind targets/base.py's interface; RULES and NOT_APPLICABLE
  view      the APC block pool (memory and disk tier) as spec.view's View
  search    random programs, judging, shrinking
  report    the report
  __main__  ./dev check-mlx-vlm (check, replay)
  findings  saved findings (JSON) and standalone pytest scripts against mlx-vlm's public API
  onefix    one copy of the installed mlx-vlm per fix (only that bug fixed); every finding's test on each
"""

PINNED = "0.7.10"
