"""What the adapter records of the server's forwards, and the tokenizer its sequential path hands
stream_generate.

Invariants: the Recorder calls the model unchanged (same arguments, same result) and only logs; a
schedule (own_ops) lists forwards and rewinds in the order the server ran them.
"""
from __future__ import annotations


class Recorder:
    """The model, called unchanged; logs every forward as ("fwd", input tokens, offset before, quantized
    layers): the offset (the largest int offset of its caches; None for batch caches) shows a rewind
    (speculative decoding trims between forwards), the quantized layers ((layer, group size, bits) of
    its QuantizedKVCache layers) where --kv-bits turned a layer into one."""

    def __init__(self, model):
        self.__dict__["_model"] = model
        self.__dict__["log"] = []

    def __call__(self, inputs, *args, **kwargs):
        cache = kwargs.get("cache", args[0] if args else None) or []
        offs = [c.offset for c in cache if isinstance(getattr(c, "offset", None), int)]
        quant = tuple((i, c.group_size, c.bits) for i, c in enumerate(cache) if type(c).__name__ == "QuantizedKVCache")
        offset = max(offs) if offs and len(offs) == len(cache) else None
        out = self._model(inputs, *args, **kwargs)
        self.log.append(("fwd", tuple(inputs.tolist()[0]), offset, quant))
        return out

    def __getattr__(self, name):
        return getattr(self._model, name)


def _tokenizer_class():
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    class Detokenizer:
        last_segment = ""

        def add_token(self, token):
            self.last_segment = f" {token}"

        def finalize(self):
            pass

    class Tokenizer(TokenizerWrapper):
        """stream_generate's tokenizer: no end-of-sequence token, token ids as text."""
        _tokenizer = None

        def __init__(self):
            pass

        @property
        def detokenizer(self):
            return Detokenizer()

        @property
        def eos_token_ids(self):
            return set()
    return Tokenizer


def _Tokenizer():
    global _TOK
    if _TOK is None:
        _TOK = _tokenizer_class()
    return _TOK()


_TOK = None


def own_ops(start: int, log) -> list:
    """A request's recorded forwards as schedule ops from position `start`: ("fwd", tokens, quantized
    layers), with ("trim", n) where a later forward starts n positions before the last one ended (a
    rewind: speculative decoding). The first starts at `start`: a fetched cache resting elsewhere is
    a wrong restore, which the replay must not copy."""
    ops, end = [], None                  # end: where the server's previous forward left its cache
    for _, tokens, offset, quant in log:
        if end is not None and offset is not None and offset < end:     # the first starts at `start`,
            ops.append(("trim", end - offset))                          # whatever the cache says
        ops.append(("fwd", tokens, quant))
        end = (offset if offset is not None else (end or 0)) + len(tokens)
    return ops
