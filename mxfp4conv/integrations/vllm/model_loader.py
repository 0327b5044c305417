"""vLLM model loader for ``load_format="mxfp4conv"``: a converted checkpoint on every worker.

Per worker: read the manifest; set its runtime environment before the model (and so the MoE
backend choice and kernels) is built; load every tensor that is not a converted expert the way
vLLM's default loader does (``model.load_weights``); for each MoE layer check the manifest
against the live layer (``checks.check_layer``), read only this rank's
``{P}.experts.rank{r}.*`` and put it into the layer (``layer.install``), bypassing the slicing
and padding weight loader. Kernel-ready bytes are judged by the live engine (``judge``) when
vLLM processes the layers after loading; ``MXFP4CONV_STRICT=1`` or
``--model-loader-extra-config '{"strict": true}'`` refuses a checkpoint the engine disagrees with
instead of letting vLLM convert its canonical bytes.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from mxfp4conv.errors import CheckpointError
from mxfp4conv.integrations.vllm.checks import LayerPlan, check_layer
from mxfp4conv.integrations.vllm.facts import METHODS, layer_facts
from mxfp4conv.integrations.vllm.layer import install, new_judge
from mxfp4conv.integrations.vllm.rank_tensors import layer_manifest, layer_tensors
from mxfp4conv.runtime.loader import _weight_map, apply_runtime_env, read_manifest

log = logging.getLogger(__name__)

LOAD_FORMAT = "mxfp4conv"
CONVERTED_EXPERT = re.compile(r"\.experts\.rank\d+\.")
_HUB_FILES = ["*.safetensors", "*.json"]


def non_expert_tensors(root: Path, weight_map: dict[str, str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of the checkpoint except the converted experts, shard by shard."""
    by_shard: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not CONVERTED_EXPERT.search(name):
            by_shard.setdefault(shard, []).append(name)
    for shard, names in by_shard.items():
        with safe_open(str(root / shard), framework="pt", device="cpu") as f:
            for name in names:
                yield name, f.get_tensor(name)


def moe_layers(model: torch.nn.Module) -> list[Any]:
    """vLLM's routed-expert layers of ``model`` (modules with a fused-MoE quant method)."""
    out = []
    for _, module in model.named_modules():
        qm = getattr(module, "quant_method", None)
        if qm is not None and hasattr(module, "layer_name") and hasattr(module, "moe_config"):
            out.append(module)
    return out


def match_layers(model: torch.nn.Module, prefixes: list[str], where: str) -> dict[str, Any]:
    """{manifest prefix: vLLM layer}: each checkpoint MoE prefix ``P`` is vLLM's ``P.experts``
    after the model's checkpoint-name mapper; every MXFP4 MoE layer of the model must be covered
    (manifest layers the model lacks, such as an MTP draft model's, are left to that model)."""
    layers = {m.layer_name: m for m in moe_layers(model)}
    mapper = getattr(model, "hf_to_vllm_mapper", None)

    def vllm_name(prefix: str) -> str | None:
        probe = f"{prefix}.experts.0.w1.weight"
        mapped = mapper._map_name(probe) if mapper is not None else probe
        return None if mapped is None else mapped[: -len(".0.w1.weight")]

    out: dict[str, Any] = {}
    for p in prefixes:
        candidates = [n for n in (vllm_name(p), f"{p}.experts") if n in layers]
        if not candidates:  # a model that nests the checkpoint's tree (or drops its root)
            want = f"{p}.experts"
            candidates = [n for n in layers if n.endswith("." + want) or want.endswith("." + n)]
        if not candidates:  # a layer of another module of the checkpoint (e.g. an MTP draft model)
            log.info("mxfp4conv: %s: MoE layer %s is not part of this model", where, p)
            continue
        if len({id(layers[c]) for c in candidates}) != 1:
            raise CheckpointError(
                f"{where}: the manifest's MoE layer {p!r} matches more than one MoE layer of vLLM's model "
                f"({', '.join(sorted(candidates))}); convert the source again.")
        out[p] = layers[candidates[0]]
    covered = {id(m) for m in out.values()}
    left = [n for n, m in layers.items() if id(m) not in covered and type(m.quant_method).__name__ in METHODS]
    if left:
        raise CheckpointError(
            f"{where}: vLLM's model has MXFP4 MoE layer(s) {', '.join(left)} that the manifest does not list; "
            "their experts would stay empty. Convert the source again.")
    return out


def worker_moe_rank(manifest: dict[str, Any]) -> int | None:
    """This worker's MoE rank in the manifest's layout, from vLLM's process groups (its data- and
    tensor-parallel ranks, flattened as vLLM does); None where the groups are not up or the server's
    tp / dp are not the manifest's, or EPLB runs redundant experts (then every shard is fetched and
    the layer checks decide)."""
    try:
        from vllm.distributed import get_dp_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        from mxfp4conv.runtime.loader import parallel_layout

        from vllm.config import get_current_vllm_config

        pc = get_current_vllm_config().parallel_config
        if pc.enable_eplb and pc.eplb_config.num_redundant_experts:
            return None  # EPLB's redundant slots take experts from other ranks' shards
        par = parallel_layout(manifest)
        dp = get_dp_group()
        if (get_tensor_model_parallel_world_size(), dp.world_size) != (par.tp, par.dp):
            return None
        return par.moe_rank(dp.rank_in_group, get_tensor_model_parallel_rank())
    except Exception:  # noqa: BLE001 (no groups yet, or another layout: fetch everything)
        return None


def hub_patterns(meta_root: Path, rank: int | None) -> list[str]:
    """The files one worker fetches from the hub: the JSON files (already in ``meta_root``), the
    shared tensors' shards and those of its MoE rank (``mxfp4conv ranks``); every shard when the
    rank is not known."""
    if rank is None:
        return list(_HUB_FILES)
    from mxfp4conv.convert.rank_files import node_share

    weight_map = _weight_map(meta_root)
    share = node_share(weight_map, [rank], {})
    return ["*.json", *share.shared_shards, *share.rank_shards]


def refresh_engine_env() -> None:
    """vLLM reads some switches once at import; read them again after runtime_env was applied."""
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        from vllm._aiter_ops import rocm_aiter_ops

        rocm_aiter_ops.refresh_env_variables()


def plan_layers(model, manifest: dict[str, Any], where: str) -> list[tuple[Any, LayerPlan]]:
    """Check every MoE layer against the live engine before anything is loaded."""
    layers = match_layers(model, list(manifest["moe"]["layers"]), where)
    return [(layer, check_layer(manifest, layer_facts(layer), p, where)) for p, layer in layers.items()]


def load_into_mxfp4conv_kernel(root: Path, own: list[tuple[Any, LayerPlan]]) -> None:
    """Layers that run mxfp4conv's kernel: vLLM's parameters are freed first (they were sized for
    vLLM's pick), then the runtime loader puts this rank's experts on the layers' device."""
    from mxfp4conv.integrations.vllm.experts import free_vllm_experts, install_mxfp4conv_kernel
    from mxfp4conv.runtime import load_moe_layers

    device = [free_vllm_experts(layer) for layer, _ in own][0]
    loaded = load_moe_layers(root, rank=own[0][1].rank, device=device, backend="triton")
    for layer, plan in own:
        install_mxfp4conv_kernel(layer, loaded[plan.prefix])


def loader_class():
    """The loader class (defined on first use, so that importing this module needs no vLLM)."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    class Mxfp4convModelLoader(DefaultModelLoader):
        """Loads a checkpoint written by ``mxfp4conv convert`` (``--load-format mxfp4conv``)."""

        def __init__(self, load_config):
            import dataclasses

            # the default loader's file discovery is that of plain safetensors checkpoints
            super().__init__(dataclasses.replace(load_config, load_format="safetensors"))
            self._root: Path | None = None

        def checkpoint_root(self, model_config) -> Path:
            if self._root is None:
                path = model_config.model
                if os.path.isdir(path):
                    self._root = Path(path)
                else:
                    from huggingface_hub import snapshot_download

                    def fetch(patterns: list[str]) -> Path:
                        return Path(snapshot_download(path, revision=model_config.revision, allow_patterns=patterns,
                                                      cache_dir=self.load_config.download_dir))

                    # the manifest and index first, then this worker's share of the shards only
                    meta = fetch(["*.json"])
                    self._root = fetch(hub_patterns(meta, worker_moe_rank(read_manifest(meta))))
            return self._root

        def load_model(self, vllm_config, model_config, prefix: str = ""):
            manifest = read_manifest(self.checkpoint_root(model_config))
            apply_runtime_env({str(k): str(v) for k, v in (manifest.get("runtime_env") or {}).items()})
            refresh_engine_env()
            return super().load_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)

        def load_weights(self, model, model_config) -> None:
            root = self.checkpoint_root(model_config)
            where = str(root)
            manifest = read_manifest(root)
            plans = plan_layers(model, manifest, where)
            weight_map = _weight_map(root)
            model.load_weights(non_expert_tensors(root, weight_map))
            judge = new_judge(manifest, where, getattr(self.load_config, "model_loader_extra_config", None))
            for layer, plan in plans:
                if plan.mode != "mxfp4conv_kernel":
                    def read(plan=plan):  # kernel-ready layers read theirs when vLLM processes them
                        return layer_tensors(root, weight_map, manifest, plan)[0]

                    install(layer, plan, read, layer_manifest(manifest, plan),
                            f"{where} ({plan.prefix}.experts.rank{plan.rank})", judge)
            own = [(layer, plan) for layer, plan in plans if plan.mode == "mxfp4conv_kernel"]
            if own:
                load_into_mxfp4conv_kernel(root, own)
            modes = sorted({p.mode for _, p in plans})
            log.info("mxfp4conv: %d MoE layers of %s loaded for rank %s (%s)", len(plans), where,
                     plans[0][1].rank if plans else "-", ", ".join(modes))

    return Mxfp4convModelLoader

