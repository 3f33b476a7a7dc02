"""Learner throughput: samples/s of gradient steps on one thread, and PPO's MLP update.

    python benchmarks/learner_throughput.py [--seconds 5] [--batch 640] [--malloc keep|default]
                                            [--rows atari,ppo_mlp]

Trains ``make_actor_critic`` on random uint8 frame stacks (4x42x42 and 4x84x84) with
RMSProp, one torch thread (a learner's share of these 2 cores), in three ways:

  nchw       float32 convolutions in PyTorch's default NCHW layout;
  channels   float32, channels-last (what ``ConvTorso`` uses);
  bf16       channels-last under bfloat16 autocast (``model.bf16=true``).

``--malloc keep`` (the default) sets up malloc as walle_ray's learners do
(``runtime/process.py``: freed blocks are kept for the next step); ``--malloc default``
leaves glibc's defaults, which give large blocks back to the OS after every step.

The ``ppo_mlp`` row times walle_ray's own PPO update (``PPOUpdate``) on the HalfCheetah
preset (``preset=ppo_halfcheetah``: 512 steps, 20 epochs of minibatches of 64, 256x256 ReLU
actor and critic) on a fixed batch: gradient steps/s, each minibatch's forward, loss,
backward, clipping and Adam step.

Each way is timed twice for ``--seconds`` after a warm-up; the better of the two counts.
Writes benchmarks/results/<--name>.json (learner_throughput by default). To see a CPU without
native bfloat16 on one that has it, cap the instruction sets:
``ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 ... --name learner_throughput_avx2``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from omegaconf import OmegaConf

from common import write_result
from walle_ray.config import ModelConfig
from walle_ray.models import make_actor_critic
from walle_ray.runtime.process import keep_freed_memory


def trainer(size: int, batch: int, way: str):
    """One gradient step per call on a fixed batch, in the given layout and precision."""
    torch.manual_seed(0)
    cfg = OmegaConf.structured(ModelConfig(bf16="true" if way == "bf16" else "false"))
    space = gym.spaces.Box(0, 255, (4, size, size), np.uint8)
    model = make_actor_critic(space, gym.spaces.Discrete(6), cfg)
    if way == "nchw":
        model.torso.convs.to(memory_format=torch.contiguous_format)
        model.torso.forward = lambda frames: model.torso.fc(model.torso.convs(frames.float() / 255.0))
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-4, eps=1e-5)
    frames = torch.randint(0, 256, (batch, 4, size, size), dtype=torch.uint8)
    actions = torch.randint(0, 6, (batch,))

    def step() -> None:
        params, value = model(frames)
        logp = torch.distributions.Categorical(logits=params).log_prob(actions)
        loss = -logp.mean() + 0.5 * value.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step


def ppo_mlp_update(compiled: bool = False):
    """One PPO iteration per call on the HalfCheetah preset's batch (17 observations, 6
    actions, 8 envs x 64 steps), eager or with ``algo.compile=true``; returns its gradient
    steps."""
    from hydra import compose, initialize_config_dir

    from walle_ray.algos import algorithm_for
    from walle_ray.batch import Rollout
    from walle_ray.algos import register_configs
    from walle_ray.config import CONF_DIR
    from walle_ray.learners.collective import Collective

    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=["algo=ppo", "env=halfcheetah", "preset=ppo_halfcheetah",
                                               f"algo.compile={str(compiled).lower()}"])
    torch.manual_seed(0)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (17,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    algo = algorithm_for(cfg.algo)
    model = algo.make_model(obs_space, action_space, cfg)
    update = algo.make_update(cfg, model, Collective(), torch.device("cpu"))
    T, B = 64, 8
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(T, B, 17)).astype(np.float32)
    with torch.no_grad():
        params, value = model(torch.from_numpy(obs.reshape(T * B, 17)))
        action, logp = model.head.act(params)
    zeros = np.zeros((T, B), np.float32)
    batch = Rollout(obs_t=obs, action_t=action.view(T, B, 6).numpy(),
                    reward_t=rng.normal(size=(T, B)).astype(np.float32),
                    terminated_t=np.zeros((T, B), bool), truncated_t=np.zeros((T, B), bool),
                    logp_t=logp.view(T, B).numpy(), dist_t=params.view(T, B, 12).numpy(),
                    v_t=value.view(T, B).numpy(), final_v_t=zeros,
                    final_obs=np.zeros((0, 17), np.float32), return_t=zeros,
                    last_obs=np.zeros((B, 17), np.float32), last_v=np.zeros(B, np.float32),
                    version_b=np.zeros(B, np.int64), replayed_b=np.zeros(B, bool))
    return lambda: update.update([batch], 0)["grad_steps"]


def grad_steps_per_s(iteration, seconds: float) -> float:
    iteration()  # warm-up
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += iteration()
    return n / (time.perf_counter() - t0)


def samples_per_s(step, batch: int, seconds: float) -> float:
    step()  # warm-up: oneDNN picks its kernels on the first call
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    return n * batch / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--batch", type=int, default=640, help="samples per step (IMPALA: 32 x 20)")
    p.add_argument("--name", default="learner_throughput", help="result file name")
    p.add_argument("--malloc", choices=("keep", "default"), default="keep")
    p.add_argument("--rows", default="atari,ppo_mlp", help="which rows: atari, ppo_mlp")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    kept = args.malloc == "keep" and keep_freed_memory()
    ways = ("nchw", "channels", "bf16")
    result = {"command": shlex.join(["python", *sys.argv]), "batch": args.batch,
              "torch_threads": 1, "malloc": "keep" if kept else "default", "samples_per_s": {}, "speedup_over_nchw": {},
              "isa_caps": {k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
                           if k in os.environ}}
    rows = args.rows.split(",")
    for size in (42, 84) if "atari" in rows else ():
        steps = {way: trainer(size, args.batch, way) for way in ways}
        best = {way: max(samples_per_s(steps[way], args.batch, args.seconds) for _ in range(2))
                for way in ways}
        result["samples_per_s"][f"{size}x{size}"] = best
        result["speedup_over_nchw"][f"{size}x{size}"] = {w: best[w] / best["nchw"] for w in ways}
        print(size, {w: round(v) for w, v in best.items()}, flush=True)
    if "ppo_mlp" in rows:
        result["ppo_mlp"] = {"preset": "ppo_halfcheetah"}
        for compiled in (False, True):
            t0 = time.perf_counter()
            iteration = ppo_mlp_update(compiled)
            iteration()  # the first update compiles
            first_s = time.perf_counter() - t0
            best = max(grad_steps_per_s(iteration, args.seconds) for _ in range(3))
            way = "compiled" if compiled else "eager"
            result["ppo_mlp"][way] = {"grad_steps_per_s": best, "samples_per_s": best * 64,
                                      "first_update_s": first_s}
            print("ppo_mlp", way, round(best), "gradient steps/s, first update",
                  f"{first_s:.1f} s", flush=True)
        result["ppo_mlp"]["compiled_speedup"] = (result["ppo_mlp"]["compiled"]["grad_steps_per_s"]
                                                 / result["ppo_mlp"]["eager"]["grad_steps_per_s"])
    write_result(args.name, result, args.dry_run)


if __name__ == "__main__":
    main()
