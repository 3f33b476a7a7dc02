"""Whether the image torso computes in bfloat16: ``model.bf16`` is auto, true or false.

``auto`` turns bfloat16 on only where the hardware computes it natively: a CPU with AMX or
AVX-512 BF16, or a GPU with bfloat16 units. Elsewhere bfloat16 is emulated and far slower
than float32 (``benchmarks/learner_throughput.py`` measures the three ways).
"""

from __future__ import annotations

import functools
import os

import torch

SETTINGS = ("auto", "true", "false")


def bf16_setting(value) -> str:
    """``model.bf16`` as one of SETTINGS; Hydra hands ``true``/``false`` over as booleans."""
    setting = str(value).lower()
    if setting not in SETTINGS:
        raise ValueError(f"model.bf16: got {value!r}; use auto (bfloat16 where the hardware "
                         "computes it natively), true or false")
    return setting


def cpu_features() -> list[str]:
    """The native bfloat16 features this CPU has, as torch detects them (AMX, AVX-512 BF16)."""
    checks = {"AMX": "_is_amx_tile_supported", "AVX512_BF16": "_is_avx512_bf16_supported"}
    return [name for name, fn in checks.items() if getattr(torch.cpu, fn, lambda: False)()]


def cpu_kernels_use_bf16() -> bool:
    """Whether torch and oneDNN may use those features: not when their instruction sets are
    capped below AVX-512 (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA), which emulates bfloat16."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    onednn = cap in ("ALL", "DEFAULT") or "AVX512" in cap or "AMX" in cap or "AVX10" in cap
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512") and onednn


@functools.cache
def native_bf16(device_type: str) -> bool:
    """Whether devices of this type here compute bfloat16 natively."""
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return False
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch before 2.3: bfloat16 units came with compute capability 8
            return torch.cuda.get_device_capability()[0] >= 8
    if device_type == "cpu":
        return bool(cpu_features()) and cpu_kernels_use_bf16()
    return False


def use_bf16(setting, device_type: str) -> bool:
    """The decision for one device type: the setting, with ``auto`` resolved."""
    setting = bf16_setting(setting)
    return native_bf16(device_type) if setting == "auto" else setting == "true"


def describe(setting, device_type: str = "cpu") -> str:
    """One line for the start of a run: what the image torso computes in, and why."""
    setting = bf16_setting(setting)
    on = use_bf16(setting, device_type)
    what = "bfloat16" if on else "float32"
    if setting != "auto":
        return f"image torso in {what} (model.bf16={setting})"
    if device_type == "cpu":
        cpu = f"{torch.backends.cpu.get_cpu_capability()}, " + (
            " and ".join(cpu_features()) or "no native bfloat16")
        if cpu_features() and not on:
            cpu += ", which kernels capped below AVX-512 cannot use"
        return f"image torso in {what} (model.bf16=auto; this CPU: {cpu})"
    return f"image torso in {what} (model.bf16=auto; {device_type} bfloat16 native: {on})"
