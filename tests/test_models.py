"""The Atari torso: channels-last and bfloat16 change the speed, not the function."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from walle_ray.config import ModelConfig
from walle_ray.models import make_actor_critic

FRAMES = gym.spaces.Box(0, 255, (4, 42, 42), np.uint8)


def model(bf16: bool = False):
    torch.manual_seed(0)
    return make_actor_critic(FRAMES, gym.spaces.Discrete(6),
                             OmegaConf.structured(ModelConfig(bf16=bf16)))


def frames(n: int = 16) -> torch.Tensor:
    return torch.randint(0, 256, (n, *FRAMES.shape), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(1))


def test_channels_last_matches_the_plain_layout():
    net, x = model(), frames()
    torso = net.torso
    assert torso.convs[0].weight.is_contiguous(memory_format=torch.channels_last)
    nchw = copy.deepcopy(torso.convs).to(memory_format=torch.contiguous_format)
    assert nchw[0].weight.is_contiguous()
    torch.testing.assert_close(torso(x), torso.fc(nchw(x.float() / 255.0)), rtol=1e-4, atol=1e-5)
    params, value = net(x)
    assert params.dtype == value.dtype == torch.float32


def test_bf16_torso_is_close_to_float32_and_trains_float32_weights():
    exact, fast = model(), model(bf16=True)
    fast.load_state_dict(exact.state_dict())
    x = frames()
    p32, v32 = exact(x)
    p16, v16 = fast(x)
    assert p16.dtype == v16.dtype == torch.float32
    torch.testing.assert_close(p16, p32, rtol=0.05, atol=0.02)
    torch.testing.assert_close(v16, v32, rtol=0.05, atol=0.05)
    (p16.logsumexp(-1).mean() + v16.pow(2).mean()).backward()
    grads = [p.grad for p in fast.parameters()]
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("bf16", [False, True])
def test_weights_round_trip_through_numpy(bf16):
    source, target = model(bf16), model(bf16)
    for p in target.parameters():
        torch.nn.init.zeros_(p)
    target.set_weights(source.get_weights())
    x = frames(4)
    torch.testing.assert_close(target(x), source(x))
    assert target.torso.convs[0].weight.is_contiguous(memory_format=torch.channels_last)


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Set whether this CPU computes bfloat16 natively (AVX-512 BF16), for ``auto``."""
    from walle_ray.models import precision

    def set_native(native: bool, capability: str = "AVX512") -> None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        precision.native_bf16.cache_clear()

    yield set_native
    precision.native_bf16.cache_clear()


@pytest.mark.parametrize("native", [False, True])
def test_auto_uses_bf16_only_on_cpus_that_compute_it_natively(cpu_bf16, native):
    from walle_ray.models.precision import describe, use_bf16

    cpu_bf16(native)
    assert use_bf16("auto", "cpu") is native
    assert use_bf16("true", "cpu") and not use_bf16("false", "cpu")  # the user's word stands
    assert ("bfloat16" if native else "float32") in describe("auto")
    exact, auto = model(False), model("auto")
    auto.load_state_dict(exact.state_dict())
    x = frames()
    same = torch.equal(auto(x)[0], exact(x)[0])
    assert same is not native  # float32 exactly, or the bfloat16 torso


def test_auto_stays_float32_where_the_kernels_are_capped_below_avx512(cpu_bf16, monkeypatch):
    from walle_ray.models.precision import describe, native_bf16, use_bf16

    cpu_bf16(True, capability="AVX2")  # ATEN_CPU_CAPABILITY=avx2 on a CPU with AVX-512 BF16
    assert not use_bf16("auto", "cpu") and "float32" in describe("auto")
    cpu_bf16(True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    native_bf16.cache_clear()
    assert not use_bf16("auto", "cpu")


def test_presets_leave_bf16_to_auto_and_bad_values_name_the_key():
    from walle_ray.algos import validate
    from walle_ray.config import ConfigError

    from conftest import make_cfg

    for algo in ("impala", "ppo", "dqn", "apex"):
        assert make_cfg(f"algo={algo}", "env=pong").model.bf16 == "auto"
    validate(make_cfg("model.bf16=true"))
    with pytest.raises(ConfigError, match=r"^model\.bf16: got 'maybe'"):
        validate(make_cfg("model.bf16=maybe"))
