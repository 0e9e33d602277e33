"""Byte-level BPE tokenizer built from GGUF metadata (no hub access).

Invariants:
- The vocabulary and merges are exactly ``tokenizer.ggml.tokens`` / ``tokenizer.ggml.merges``;
  token ids are positions in that list.
- Control tokens (``tokenizer.ggml.token_type`` == 3) are special tokens: they encode to one id and
  are never split (PLATFORM.md), and ``decode(..., skip_special_tokens=True)`` drops them.
- ``apply_chat_template`` renders ``tokenizer.chat_template`` with jinja2 and encodes the result
  without adding anything (the GGUF says add_bos_token False).
"""

from __future__ import annotations

from typing import Optional, Sequence

import mlx.core as mx

CONTROL = 3


def _value(meta: dict, key: str, default=None):
    if key not in meta:
        return default
    v = meta[key]
    if isinstance(v, mx.array):
        return v.item() if v.ndim == 0 else v.tolist()
    return v


class GGUFTokenizer:
    def __init__(self, tokenizer, chat_template: Optional[str], eos_token_id: int, bos_token_id: Optional[int]):
        self._tok = tokenizer
        self.chat_template = chat_template
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._template = None

    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> "GGUFTokenizer":
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        tokens = list(_value(meta, "tokenizer.ggml.tokens"))
        merges = [tuple(m.split(" ", 1)) for m in _value(meta, "tokenizer.ggml.merges")]
        types = list(_value(meta, "tokenizer.ggml.token_type"))
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        tok.decoder = decoders.ByteLevel()
        specials = [AddedToken(tokens[i], special=True, normalized=False) for i, t in enumerate(types) if t == CONTROL]
        tok.add_special_tokens(specials)
        eos = int(_value(meta, "tokenizer.ggml.eos_token_id"))
        bos = _value(meta, "tokenizer.ggml.bos_token_id")
        return cls(tok, _value(meta, "tokenizer.chat_template"), eos, None if bos is None else int(bos))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and each token's [start, end) character range in `text`."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, [tuple(o) for o in enc.offsets]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> Optional[int]:
        return self._tok.token_to_id(token)

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = True):
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        if self._template is None:
            import jinja2

            env = jinja2.Environment(trim_blocks=False, lstrip_blocks=False, keep_trailing_newline=True)
            self._template = env.from_string(self.chat_template)
        text = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text
