"""The CUDA path: weights in their GGUF blocks on the device, fused kernels, layer offload (llama.cpp's -ngl)."""
from __future__ import annotations

import logging

import numpy as np

from engine.backend import Backend
from engine.errors import SettingError
from engine.gpu.memory import GpuMemoryEstimate, describe, estimate_gpu_memory
from engine.gpu.plan import arch_plan
from engine.gpu.runner import GpuNet
from engine.models.decoder import DecoderModel

__all__ = ["GpuNet", "GpuMemoryEstimate", "estimate_gpu_memory", "to_device"]

log = logging.getLogger(__name__)


def _cpu(why: str) -> Backend:
    return Backend("numpy", np, note=why)


def to_device(
    net: DecoderModel, backend: Backend, gpu_layers: int | None = None, *, n_ctx: int | None = None,
    notes: list[str] | None = None,
) -> tuple[DecoderModel | GpuNet, Backend]:
    """Put the last `gpu_layers` layers (default all) and the head of a NumPy model on the GPU.

    Fewer layers when the memory estimate says they do not fit or the upload runs out of memory, none (the
    NumPy model, on a NumPy backend) when even one does not or the GPU cannot run the model; each decision
    is appended to `notes`.
    """
    notes = [] if notes is None else notes
    n = net.args.n_layers
    if gpu_layers is not None and gpu_layers < 0:
        raise SettingError(f"--gpu-layers {gpu_layers}: must be 0 or more")
    want = n if gpu_layers is None else min(gpu_layers, n)
    if want == 0:
        return net, _cpu("--gpu-layers 0: every layer runs on the CPU")
    try:
        plan = arch_plan(net)
    except SettingError as exc:
        why = f"{exc}; running on the CPU"
        notes.append(why)
        return net, _cpu(why)
    mem = backend.device_memory()
    est = estimate_gpu_memory(plan, net.args, n_ctx=n_ctx, free=mem[0] if mem else None)
    log.info("GPU memory estimate: %s", describe(est))
    fit = est.layers_that_fit()
    if fit < want:
        why = f"not enough GPU memory for {want} layers: {est.message(want)}"
        if fit == 0:
            notes.append(f"{why}; running on the CPU")
            return net, _cpu(notes[-1])
        notes.append(f"{why}; putting {fit} layers on the GPU, the rest on the CPU")
        want = fit
    while want > 0:
        try:
            return GpuNet(net, backend, want), backend
        except SettingError as exc:  # a tensor type or shape the kernels do not take
            why = f"{exc}; running on the CPU"
            notes.append(why)
            return net, _cpu(why)
        except Exception as exc:  # noqa: BLE001 - sorted below; anything that is not a CUDA fault is raised
            kind = backend.classify_error(exc)
            if kind is None:
                raise
            backend.free_cached_memory()
            if kind == "oom" and want > 1:
                fewer = want // 2
                notes.append(f"out of GPU memory loading {want} layers; trying {fewer}")
                want = fewer
                continue
            why = f"the GPU could not take the model ({type(exc).__name__}: {exc}); running on the CPU"
            notes.append(why)
            return net, _cpu(why)
    why = "out of GPU memory for even one layer; running on the CPU"
    notes.append(why)
    return net, _cpu(why)
