"""What a live vLLM MoE layer says about itself: the facts a converted checkpoint must match.

``EngineFacts`` is plain data (the checks and their tests need no vLLM); ``layer_facts`` reads
it from a vLLM ``RoutedExperts`` layer and vLLM's platform, importing vLLM lazily.
"""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("Mxfp4MoEMethod", "GptOssMxfp4MoEMethod", "QuarkOCP_MX_MoEMethod")


@dataclass(frozen=True)
class EngineFacts:
    layer: str  # vLLM's layer name (``RoutedExperts.layer_name``)
    vllm_release: str  # vllm.__version__
    arch: str  # mxfp4conv's arch name for the device (gfx950, sm90, cpu, ...)
    platform: str  # rocm | cuda | cpu | other
    method: str  # the layer's quant method class name
    backend: str  # the Mxfp4MoeBackend member vLLM's oracle picked for this layer
    tp_size: int  # the MoE layer's tensor-parallel size (vLLM flattens DP into it)
    tp_rank: int
    ep_size: int
    ep_rank: int
    use_ep: bool
    hidden_padded: int  # the layer's hidden size after the method's round-up
    intermediate_padded: int  # per partition, after the round-up
    local_experts: int
    activation: str  # MoEActivation value (silu, situ, swigluoai, ...)
    situv2: str | None  # SiTUv2 activation dtype (a16w4 | a8w4 | a4w4) when AITER MoE runs SiTU
    aiter_moe: bool  # AITER fused MoE enabled (ROCm)
    placement: str = "linear"  # expert placement across EP ranks (vLLM's expert_placement_strategy)
    dp_size: int = 1  # the server's data-parallel size (FusedMoEParallelConfig.dp_size)
    dp_rank: int = 0
    pcp_size: int = 1  # prefill-context parallel size
    enable_eplb: bool = False
    global_experts: int = 0  # physical experts of the layer (logical + EPLB's redundant ones); 0: unknown
    logical_experts: int = 0  # the model's experts; 0: unknown
    expert_ids: tuple[int, ...] = ()  # global ids of this rank's experts in local order (the expert map)

    @property
    def server_tp(self) -> int:
        """The server's --tensor-parallel-size (vLLM flattened dp x pcp into the MoE size)."""
        return max(1, self.parallel_size // max(1, self.dp_size * self.pcp_size))

    @property
    def parallel_size(self) -> int:
        return self.ep_size if self.use_ep else self.tp_size

    @property
    def parallel_rank(self) -> int:
        return self.ep_rank if self.use_ep else self.tp_rank


def cuda_arch(major: int, minor: int) -> str:
    """mxfp4conv's arch name for a CUDA compute capability (families as vLLM groups them)."""
    if major == 9:
        return "sm90"
    if major == 10:
        return "sm100"
    if major == 12:
        return "sm120"
    return f"sm{major}{minor}"


def live_platform() -> tuple[str, str]:
    """(platform, arch) of the device vLLM runs on."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu", "cpu"
    if current_platform.is_rocm():
        from vllm.platforms import rocm

        return "rocm", str(rocm._GCN_ARCH).split(":")[0].lower()
    if current_platform.is_cuda():
        cap = current_platform.get_device_capability()
        return "cuda", cuda_arch(int(cap.major), int(cap.minor))
    return "other", str(getattr(current_platform, "device_name", "unknown"))


def _situv2(platform: str, activation: str) -> tuple[bool, str | None]:
    if platform != "rocm":
        return False, None
    from vllm._aiter_ops import rocm_aiter_ops

    enabled = bool(rocm_aiter_ops.is_fused_moe_enabled())
    if not enabled or activation != "situ":
        return enabled, None
    return enabled, str(rocm_aiter_ops.get_fused_moe_situv2_activation())  # a16w4 | a8w4 | a4w4


def layer_facts(layer) -> EngineFacts:
    """The facts of one vLLM MoE layer (``RoutedExperts``) on this worker."""
    import vllm

    qm = layer.quant_method
    pc = layer.moe_config.moe_parallel_config
    platform, arch = live_platform()
    activation = getattr(layer.activation, "value", str(layer.activation)).lower()
    aiter_moe, situv2 = _situv2(platform, activation)
    backend = getattr(qm, "mxfp4_backend", None)
    return EngineFacts(
        layer=str(getattr(layer, "layer_name", "")),
        vllm_release=str(vllm.__version__),
        arch=arch,
        platform=platform,
        method=type(qm).__name__,
        backend=getattr(backend, "name", str(backend)),
        tp_size=int(pc.tp_size),
        tp_rank=int(pc.tp_rank),
        ep_size=int(pc.ep_size),
        ep_rank=int(pc.ep_rank),
        use_ep=bool(pc.use_ep),
        hidden_padded=int(layer.hidden_size),
        intermediate_padded=int(layer.intermediate_size_per_partition),
        local_experts=int(layer.local_num_experts),
        activation=activation,
        situv2=situv2,
        aiter_moe=aiter_moe,
        placement=str(getattr(layer, "expert_placement_strategy", "linear")),
        dp_size=int(pc.dp_size),
        dp_rank=int(pc.dp_rank),
        pcp_size=int(getattr(pc, "pcp_size", 1)),
        enable_eplb=bool(getattr(pc, "enable_eplb", False)),
        global_experts=int(layer.moe_config.num_experts),
        logical_experts=int(getattr(layer.moe_config, "num_logical_experts", layer.moe_config.num_experts)),
        expert_ids=_expert_ids(layer),
    )


def _expert_ids(layer) -> tuple[int, ...]:
    """This rank's global expert ids in local order, from vLLM's expert map (-1 elsewhere)."""
    manager = getattr(layer, "expert_map_manager", None)
    emap = getattr(manager, "expert_map", None) if manager is not None else None
    n = int(layer.moe_config.num_experts)
    if emap is None:
        return tuple(range(n))
    m = [int(v) for v in emap.reshape(-1)[:n].tolist()]
    held = sorted((local, g) for g, local in enumerate(m) if local >= 0)
    return tuple(g for _, g in held)
