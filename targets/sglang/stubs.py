"""Stand-ins for the GPU-only modules SGLang's radix caches import but never call on the CPU.

SGLang's mem_cache modules reach, through long import chains (memory pools -> attention layers ->
all-reduce kernels), packages that exist only for CUDA builds: triton (kernel definitions), tvm_ffi,
sgl_kernel, flashinfer, torchvision and the like. The radix caches and their CPU allocators never
call them. `install()` puts a meta-path finder in front of the import system that serves any
module under STUBBED that is not installed as a permissive stub: every attribute is another stub,
calling one returns a stub, and used as a decorator (one function argument) it returns the function.

Invariants:
- a module that really is installed is always the real one (the finder only answers when the
  ordinary finders cannot);
- only imports made by SGLang's own modules are served: other packages (transformers) probe
  optional packages with find_spec and must keep seeing them absent;
- `touched()` lists the stub modules imported, so a report can say what was stood in for.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STUBBED = ("triton", "tvm_ffi", "torchvision", "sentencepiece", "compressed_tensors", "gguf", "partial_json_parser", "vllm", "sgl_kernel")
# attributes that raise (as on a machine without a GPU driver): code probing them falls back to the CPU
MISSING = ("triton.runtime.driver.active",)

_touched: set = set()


class _Any(types.ModuleType):
    """A module, a class, a function and a value at once."""

    def __init__(self, name="stub"):
        super().__init__(name)
        self.__path__ = []                     # a package: submodules import too

    def __getattr__(self, item):
        if item.startswith("__") and item.endswith("__") or f"{self.__name__}.{item}" in MISSING:
            raise AttributeError(item)
        v = _Any(f"{self.__name__}.{item}")
        setattr(self, item, v)
        return v

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], _Any):
            return args[0]                     # a decorator: @triton.jit, @torch_compile-like
        if not args and kwargs:
            return lambda f: f                 # a decorator factory: @triton.autotune(configs=...)
        return _Any(f"{self.__name__}()")

    def __getitem__(self, item):
        return _Any(f"{self.__name__}[]")

    def __mro_entries__(self, bases):
        return (object,)                       # `class X(stub.Base)` works

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False

    def __int__(self):
        return 0

    def __index__(self):
        return 0

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __repr__(self):
        return f"<stub {self.__name__}>"


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        top = fullname.split(".")[0]
        if top not in STUBBED or not _from_sglang():
            return None
        for f in sys.meta_path:                # installed for real: not ours to answer
            if f is self:
                continue
            try:
                spec = f.find_spec(fullname, path, target)
            except Exception:
                spec = None
            if spec is not None:
                return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        _touched.add(spec.name)
        m = _Any(spec.name)
        m.__spec__ = spec
        m.__version__ = "0.0.0"
        return m

    def exec_module(self, module):
        pass


def _from_sglang() -> bool:
    """Is the import statement being served in SGLang's own code (or a stub's submodule)? Other
    packages (transformers) probe optional packages with find_spec and must see them absent."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_globals.get("__name__", "")
        file = f.f_code.co_filename
        if not (file.startswith("<frozen") or "importlib" in file or name == __name__):
            return name.startswith("sglang") or name.split(".")[0] in STUBBED
        f = f.f_back
    return False


_FINDER = _Finder()


def install() -> None:
    """Serve the stubs from now on. torch's compiler stack and transformers' auto classes are
    imported first, while no stub exists: they probe for triton / torchvision and must find none."""
    import torch
    import torch._dynamo  # noqa: F401
    torch.compile(lambda x: x)                 # imports the inductor modules @torch.compile needs
    try:                                       # transformers decides what is installed once, stub-free
        import transformers
        from transformers import AutoProcessor  # noqa: F401
        import transformers.models.llama.modeling_llama  # noqa: F401
    except Exception:
        pass
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def settle() -> None:
    """After SGLang's modules are imported: drop the stubs from sys.modules (SGLang's modules keep
    their references), so a later probe by torch or transformers finds the packages absent again."""
    for name in list(sys.modules):
        if isinstance(sys.modules[name], _Any):
            del sys.modules[name]


def touched() -> list:
    return sorted(_touched)
