"""Stand-ins for what vLLM 0.33.0 imports but a CPU test machine does not have.

Runs inside the worker process only (see ``harness``). Every stub is named with the reason it
exists: ``STUBS`` always replace the real package (kernels, compiled ops: what a CPU machine
cannot run and what decides backends), ``STUBS_IF_ABSENT`` only where the package is not
installed (pure-Python helpers vLLM imports on the way; a real one is used when present).
A module not listed is imported for real or not at all, so vLLM's own "is it installed"
checks (``find_spec``) see exactly the listed packages.

A stub module answers every attribute with another stub; calling one returns a stub, so
decorators, ``torch.library`` registrations and type annotations that name it still import.
``calls`` records the stubbed functions the code under test called (name, args, kwargs).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

# top-level module -> why it is stubbed. Platform-specific ones are added per platform
# (``worker.PLATFORM_STUBS``); the harness lists the set it used with every result.
STUBS: dict[str, str] = {
    "humming": "Humming MoE kernels (config.GemmType is a real enum): converters recorded, not run",
    "tilelang": "tilelang kernels (CUDA)",
    "flash_attn": "attention kernels",
    "vllm._C": "vLLM's compiled ops",
    "vllm._moe_C_stable_libtorch": "vLLM's compiled MoE ops",
    "vllm._C_stable_libtorch": "vLLM's compiled ops",
    "vllm._rocm_C": "vLLM's compiled ROCm ops",
    "vllm._moe_C": "vLLM's compiled MoE ops",
    "vllm._flashmla_C": "compiled attention ops",
    "vllm.cumem_allocator": "compiled allocator",
}
STUBS_IF_ABSENT: dict[str, str] = {
    "psutil": "system metrics (vllm.utils); not read by the MoE code paths",
    "zmq": "engine IPC (vllm.utils.network_utils); not used by the MoE code paths",
    "msgspec": "engine serialisation; imported by vllm.config, not used here",
    "cbor2": "engine serialisation",
    "blake3": "prefix-cache hashing",
    "cachetools": "engine caches",
    "cloudpickle": "engine serialisation",
    "pybase64": "multimodal inputs",
    "ijson": "tokenizer loading",
    "setproctitle": "process names",
    "py_cpuinfo": "CPU model strings",
    "boto3": "vLLM's S3 helpers, imported by its model loader; not used here",
    "cpuinfo": "CPU model strings (py-cpuinfo)",
    "openai_harmony": "gpt-oss chat format",
    "partial_json_parser": "tool parsers",
    "gguf": "GGUF loader",
    "transformers": "Hugging Face model configs; only their class names are imported here",
    "compressed_tensors": "compressed-tensors quantization configs (not a path under test)",
    "depyf": "torch.compile debugging",
    "einops": "model code",
    "aiohttp": "HTTP client (vllm.connections)",
    "av": "video decoding", "cv2": "image decoding", "soundfile": "audio", "soxr": "audio",
    "torchaudio": "audio", "torchcodec": "video",
    "fastapi": "API server", "uvloop": "API server", "openai": "API server types",
    "prometheus_client": "metrics", "opentelemetry": "tracing",
    "llguidance": "structured output", "xgrammar": "structured output",
    "fastsafetensors": "weight loading", "runai_model_streamer": "weight loading",
    "tensorizer": "weight loading", "xxhash": "hashing",
    # imported at module level by vLLM files on the way, absent from a bare test venv
    # (discovered by running the suite in one); none is called by the MoE code paths
    "urllib3": "absent from a bare test environment",
    "requests": "absent from a bare test environment",
    "PIL": "absent from a bare test environment",
}


def absent(name: str) -> bool:
    """Not installed (checked on the real path, before any stub finder)."""
    return importlib.machinery.PathFinder.find_spec(name) is None

calls: list[tuple[str, tuple, dict]] = []


class StubBase:
    """What a class deriving from a stub derives from instead."""

    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __class_getitem__(cls, item):
        return cls

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        from pydantic_core import core_schema
        return core_schema.any_schema()


class Stub(types.ModuleType):
    """A module (or attribute of one) that stands for anything."""

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        sub = Stub(f"{self.__name__}.{name}")
        sub.__path__ = []
        setattr(self, name, sub)
        return sub

    def __call__(self, *args, **kwargs):
        calls.append((self.__name__, args, kwargs))
        if len(args) == 1 and callable(args[0]) and not kwargs:  # used as a decorator
            return args[0]
        return Stub(f"{self.__name__}()")

    def __mro_entries__(self, bases):
        return (StubBase,)

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __getitem__(self, key):
        return self

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return True

    def __get_pydantic_core_schema__(self, source, handler):  # a stub type in a pydantic model
        from pydantic_core import core_schema
        return core_schema.any_schema()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: set[str]):
        self.names = names

    def _covered(self, fullname: str) -> bool:
        parts = fullname.split(".")
        return any(".".join(parts[:i]) in self.names for i in range(1, len(parts) + 1))

    def find_spec(self, fullname, path, target=None):
        if not self._covered(fullname):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        mod = Stub(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


def fake_amdsmi(gcn_arch: str) -> types.ModuleType:
    """amdsmi answering one GPU of ``gcn_arch``: what vLLM's ROCm platform detection reads."""
    m = types.ModuleType("amdsmi")

    class AmdSmiException(Exception):
        pass

    m.AmdSmiException = AmdSmiException
    m.AmdSmiMemoryType = types.SimpleNamespace(VRAM=0)
    m.amdsmi_init = lambda *a, **k: None
    m.amdsmi_shut_down = lambda *a, **k: None
    m.amdsmi_get_processor_handles = lambda: [0]
    m.amdsmi_get_gpu_asic_info = lambda h: {"target_graphics_version": gcn_arch,
                                            "device_id": "0x0", "market_name": gcn_arch}
    m.amdsmi_get_gpu_device_uuid = lambda h: "0"
    m.amdsmi_get_gpu_memory_total = lambda h, kind: 192 << 30
    m.amdsmi_topo_get_link_type = lambda a, b: {"type": 0}
    m.amdsmi_topo_get_numa_node_number = lambda h: 0
    return m


def fake_humming() -> dict[str, types.ModuleType]:
    """humming (a stub) whose ``config.GemmType`` is a real enum: the Humming experts'
    ``is_supported_config`` compares its values with the gemm type the layer prefers."""
    import enum

    root = Stub("humming")
    root.__path__ = []
    config = Stub("humming.config")
    config.__path__ = []
    config.GemmType = enum.Enum("GemmType", {"INDEXED": "indexed",
                                             "GROUPED_CONTIGUOUS": "grouped_contiguous",
                                             "GROUPED_MASKED": "grouped_masked"})
    root.config = config
    return {"humming": root, "humming.config": config}


_finder: _StubFinder | None = None


def set_present(name: str, present: bool) -> None:
    """Make the stubbed package ``name`` importable or not from now on (vLLM's
    ``has_quark()``-style checks import afresh on every call)."""
    assert _finder is not None, "install() first"
    if present:
        _finder.names.add(name)
    else:
        _finder.names.discard(name)
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def install(names: set[str], modules: dict[str, types.ModuleType]) -> None:
    """Serve ``names`` (and their submodules) as stubs; put ``modules`` in sys.modules."""
    global _finder
    for name, mod in modules.items():
        if getattr(mod, "__spec__", None) is None:  # find_spec() of a sys.modules entry reads it
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules.update(modules)
    _finder = _StubFinder(set(names))  # submodules of ``modules`` too
    sys.meta_path.insert(0, _finder)
