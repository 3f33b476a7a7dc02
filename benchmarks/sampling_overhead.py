"""Sampling overhead: env steps/s of one Ray sampler against a bare loop doing the same work.

    python benchmarks/sampling_overhead.py [--env cartpole|halfcheetah|pong]
                                           [--fragment-length L] [--rounds N] [--repeats 5]

Nine ways to collect with the same envs (``walle_ray/conf/env/<env>.yaml``: its id and
``envs_per_sampler``) and the same policy (one ``make_actor_critic`` model, one torch thread,
sampled actions with their log-probabilities; the critic is not run to act, so the bare
loop never runs it, and the sampler's one batched value pass per fragment counts as its
overhead):

  bare     a plain gymnasium loop over the envs with batched inference, in a fresh plain
           process (no Ray) and without walle_ray's sampler or env code (for Pong, the
           ``ale_py.AtariVectorEnv`` a sampler steps, with the same settings, stepped
           directly);
  sampler  ``Sampler.collect()`` in that same process: the framework without Ray;
  sampler_critic_per_step  (a diagnostic, for vector observations) the same with the critic
           run at every step beside the policy, instead of once per fragment on all its
           observations (Pong's conv net shares its torso, so its sampler always runs both);
  fleet    one ``RemoteSampler`` actor (num_cpus 0.95), started as walle_ray starts its
           samplers (on one CPU with the env threads it starts: ``topology.pin_samplers``,
           on by default; ``--no-pin`` leaves it free), that already holds the weights;
           this driver fetches whole fragments back to back, so a Ray round trip and the
           fragment's transfer count once per fragment (the synchronous, PPO path);
  stream   a sampler actor in streaming mode (``run``, the asynchronous path): it pushes
           every fragment into a memory actor (here a sink that drops it) while it collects
           the next, and skips the value of each fragment's last observation, as IMPALA's
           samplers do (its learners compute that value);
  bare_in_actor  (a diagnostic) the bare loop inside a Ray actor started as walle_ray starts
           samplers (pinned, unless ``--no-pin``), with torch imported before the process joins Ray
           (``walle_ray/runtime/preload.py``); against this row, the fleet's numbers show
           what walle_ray's sampler and transfers add;
  bare_in_actor_no_preload  the same in an actor started Ray's default way, which imports
           torch only after joining: 10-15% slower on this machine;
  ray_call (a diagnostic: the floor of request/response) one Ray call per fragment to an
           actor, started as a sampler, that only keeps its CPU busy for as long as the bare
           loop takes per fragment (in the plain process of the same repeat) and returns
           nothing: what one call around that much work costs on this machine, with no
           sampler, no env and no data. No request/response sampler can beat it;
  ray_stream (a diagnostic: the floor of streaming) the same actor, busy as long per fragment,
           making a streaming sampler's calls around it: it asks the parameter server for
           weights halfway through each fragment (early enough that the answer is never
           waited for, which a sampler's adaptive lead only approaches) and puts a
           ready-made fragment of this env into the sink, one put in flight.

The bare loop and the sampler in the plain process are never pinned: the baseline is the loop
a user writes without walle_ray.

Each is timed over ``--rounds`` fragments (by default as many as make 6400 steps per env; 800
for Pong, whose steps cost 30 times as much),
``--repeats`` times, each time in new processes (one plain process for bare and sampler, new
actors for the rest). Each repeat times the plain process before and after the actors, and
compares every way with the bare loop of its own repeat; the overheads are the medians of
those ratios, so the machine's drift from one repeat to the next cancels. Writes
benchmarks/results/sampling_overhead[_<env>][_f<fragment length>].json (no ``_f`` at the
env's default length: 128, and 20 for Pong, the 20-step unrolls of ``preset=impala_pong``;
``_nopin`` added with ``--no-pin``).

``ms_per_fragment`` splits each fleet way's time per fragment into the part inside
``Sampler.collect`` (in the actor, from the stats it returns) and the rest: Ray calls, the
fragment's transfer, the weights check. Beside them, the plain process's collect and bare
loop per fragment; so the overhead reads as framework work (collect against bare) plus Ray.

Target: overhead = 1 - fleet / bare under 10%; reported for both fleet paths. The fleet's
cost is mostly a fixed cost per fragment (its Ray calls), so it shrinks with longer
fragments: run with ``--fragment-length 512`` or ``2048`` to see by how much.
``overhead_floor_request_response`` is the ``ray_call`` row's share of time outside its
busy spell: where it is above the target, no request/response sampler meets it at that
fragment length on this machine. ``overhead_floor_streaming`` is the same for ``ray_stream``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shlex
import statistics
import sys
import time

import gymnasium as gym
import numpy as np
import ray
import torch
from omegaconf import DictConfig, OmegaConf

from common import ROOT, write_result
from walle_ray.algos.spec import fragment_sampler, fragment_sampler_args
from walle_ray.config import EnvConfig, ModelConfig
from walle_ray.envs import env_spaces, make_vector_env
from walle_ray.models import ActorCritic, make_actor_critic
from walle_ray.runtime.preload import worker_runtime_env
from walle_ray.actors.sampler import Sampler
from walle_ray.runtime.remote import MemoryRef, RemoteParameterServer, RemoteSampler, SlotSpec
from walle_ray.runtime.sampler_worker import pin_to_cpu

TARGET_OVERHEAD = 0.10
ASK_SHARE = 1 / 2  # ray_stream asks for weights halfway through: the answer is never waited for
SAMPLER_CPUS = 0.95  # two sampler actors (fleet, stream) plus the tiny ones fit in 2 CPUs
GAMMA = 0.99


def default_length(env: str) -> int:
    """The fragment length both paths run at with no ``--fragment-length``: 20 for Pong
    (``preset=impala_pong``'s unrolls), 128 otherwise."""
    return 20 if env == "pong" else 128


def load_env_cfg(name: str) -> DictConfig:
    """The env group option ``env=<name>`` as the CLI would compose it."""
    return OmegaConf.merge(OmegaConf.structured(EnvConfig),
                           OmegaConf.load(ROOT / "walle_ray" / "conf" / "env" / f"{name}.yaml"))


class BareLoop:
    """What any sampler minimally does: step B gymnasium envs on batched policy samples."""

    def __init__(self, env_cfg: DictConfig, model: ActorCritic, seed: int):
        self.model = model
        self.envs = [gym.make(env_cfg.id, **dict(env_cfg.kwargs or {}))
                     for _ in range(env_cfg.envs_per_sampler)]
        self.obs = np.stack([env.reset(seed=seed + i)[0]
                             for i, env in enumerate(self.envs)]).astype(np.float32)
        space = self.envs[0].action_space
        self.bounds = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None

    @torch.inference_mode()
    def run(self, steps: int) -> None:
        for _ in range(steps):
            params = self.model.policy(torch.from_numpy(self.obs))  # acting needs no value
            action, _logp = self.model.head.act(params)
            actions = action.numpy()
            if self.bounds is not None:
                actions = np.clip(actions, *self.bounds)
            else:  # Python ints: the quick path of gymnasium's Discrete.contains
                actions = actions.tolist()
            for i, env in enumerate(self.envs):
                obs, _reward, terminated, truncated, _ = env.step(actions[i])
                if terminated or truncated:
                    obs, _ = env.reset()
                self.obs[i] = obs

    def close(self) -> None:
        for env in self.envs:
            env.close()


class BareAtariLoop:
    """The same for Atari: the sampler's own ``ale_py.AtariVectorEnv`` (frames preprocessed,
    stacked and autoreset in C++), stepped directly rather than through walle_ray's
    ``AtariEnv`` (which copies frames into the fragment and keeps episode records)."""

    def __init__(self, env_cfg: DictConfig, model: ActorCritic, seed: int):
        self.model = model
        self.env = make_vector_env(env_cfg).env
        self.obs, _ = self.env.reset(seed=seed)

    @torch.inference_mode()
    def run(self, steps: int) -> None:
        for _ in range(steps):
            action, _logp = self.model.head.act(self.model.policy(torch.from_numpy(self.obs)))
            self.obs, _reward, _terminated, _truncated, _info = self.env.step(action.numpy())

    def close(self) -> None:
        self.env.close()


def bare_loop(env_cfg: DictConfig, model: ActorCritic, seed: int):
    """The bare loop for this env: Atari's vector env, or a list of gymnasium envs."""
    cls = BareAtariLoop if env_cfg.id.startswith("ALE/") else BareLoop
    return cls(env_cfg, model, seed)


def policy(env_cfg: DictConfig, model_cfg: DictConfig, weights: dict) -> ActorCritic:
    """The benchmark's policy, with ``weights``, in this process (one torch thread)."""
    torch.set_num_threads(1)
    obs_space, action_space = env_spaces(env_cfg)
    model = make_actor_critic(obs_space, action_space, model_cfg, env_cfg.normalize_obs).eval()
    model.set_weights(weights)
    return model


def spin(seconds: float) -> None:
    """Keep this CPU busy for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@ray.remote(num_cpus=0.01)
class Busy:
    """An actor that only keeps its CPU busy, with a sampler's Ray calls around it: the
    floors of request/response (``ray_call``) and streaming (``ray_stream``)."""

    def __init__(self, pin: int | None, ps=None, memory=None, fragment=None):
        pin_to_cpu(pin)
        self.ps, self.memory, self.fragment = ps, memory, fragment

    def spin(self, seconds: float) -> None:
        spin(seconds)

    def stream(self, rounds: int, seconds: float, ask_share: float) -> None:
        """``rounds`` times: busy for ``seconds``, asking the parameter server for weights
        ``ask_share`` of them before the end, then the (ready-made) fragment put into the
        memory with one put in flight: the calls of ``SamplerWorker.run`` around no work."""
        pending = None
        for _ in range(rounds):
            spin(seconds * (1 - ask_share))
            asked = self.ps.latest.remote(0)
            spin(seconds * ask_share)
            ray.get(asked)
            if pending is not None:
                ray.get(pending)
            pending = self.memory.put.remote(self.fragment)
        ray.get(pending)


def pin_slot(args) -> int | None:
    """The ``pin`` walle_ray gives sampler 0 (``topology.pin_samplers``), or None with ``--no-pin``."""
    return 0 if args.pin else None


def timed(fn, calls: int) -> tuple[float, list]:
    """Seconds of ``calls`` back-to-back calls of ``fn``, and what they returned."""
    t0 = time.perf_counter()
    results = [fn() for _ in range(calls)]
    return time.perf_counter() - t0, results


def steps_per_s(fn, rounds: int, steps_per_round: int) -> float:
    """Env steps per second of ``rounds`` back-to-back calls of ``fn``."""
    return rounds * steps_per_round / timed(fn, rounds)[0]


def stream_fragment(env_cfg: DictConfig, model_cfg: DictConfig, weights: dict, args):
    """A fragment as the streaming sampler sends it (no value of its last observation),
    for ``ray_stream`` to put: the same arrays, so the same serialization."""
    sampler = fragment_sampler(env_cfg, model_cfg, args.fragment_length, GAMMA, 0, args.seed,
                               bootstrap_value=False)
    sampler.set_weights(weights, 0)
    rollout, _stats = sampler.collect()
    sampler.close()
    return rollout


def start_fleet(env_cfg: DictConfig, model_cfg: DictConfig, weights: dict, args):
    """A parameter server holding ``weights`` as version 0, and one sampler actor reading it."""
    ps = RemoteParameterServer.options(num_cpus=0.01).remote()
    ray.get(ps.publish.remote(0, [ray.put(weights)]))
    worker = RemoteSampler.options(num_cpus=SAMPLER_CPUS, runtime_env=worker_runtime_env()).remote(
        ps, [SlotSpec(Sampler, fragment_sampler_args(env_cfg, model_cfg, args.fragment_length,
                                                     GAMMA, 0, args.seed))],
        pin=pin_slot(args))
    return ps, worker


@ray.remote(num_cpus=0.01)
class Sink:
    """A memory that accepts every fragment and keeps none."""

    def put(self, rollout, key: int = 0) -> float:
        return 0.0


@ray.remote(num_cpus=0.01)  # run alone, like every way; a token CPU lets it start beside the rest
class BareActor:
    """The bare loop inside a Ray actor process: what the same work costs there with no
    framework at all. A diagnostic: it separates the cost of running in a Ray worker
    process from what walle_ray's sampler and transfers add."""

    def __init__(self, env_cfg: DictConfig, model_cfg: DictConfig, weights: dict, seed: int,
                 pin: int | None):
        pin_to_cpu(pin)  # before the env starts its threads, as a pinned sampler does
        self.bare = bare_loop(env_cfg, policy(env_cfg, model_cfg, weights), seed)

    def run(self, rounds: int, steps: int) -> None:
        for _ in range(rounds):
            self.bare.run(steps)


_PLAIN: dict = {}  # in the plain process: its bare loop and sampler, kept for the whole repeat


def start_plain(env_cfg: DictConfig, model_cfg: DictConfig, weights: dict, args) -> None:
    """Pool initializer: the bare loop and ``Sampler`` of a fresh plain process (no Ray)."""
    sampler = fragment_sampler(env_cfg, model_cfg, args.fragment_length, GAMMA, 0, args.seed)
    sampler.set_weights(weights, 0)
    _PLAIN.update(bare=bare_loop(env_cfg, policy(env_cfg, model_cfg, weights), args.seed),
                  sampler=sampler, args=args, per_round=args.fragment_length * env_cfg.envs_per_sampler)
    if sampler.policy.separate:  # the diagnostic: the critic at every step, as it once ran
        per_step = fragment_sampler(env_cfg, model_cfg, args.fragment_length, GAMMA, 0, args.seed)
        per_step.set_weights(weights, 0)
        per_step.policy.separate = False
        _PLAIN["sampler_critic_per_step"] = per_step


def time_plain() -> dict:
    """Env steps/s of the bare loop and of ``Sampler.collect`` in the plain process,
    alternating, each over ``--rounds`` fragments."""
    args = _PLAIN["args"]
    ways = {"bare": lambda: _PLAIN["bare"].run(args.fragment_length), "sampler": _PLAIN["sampler"].collect}
    if "sampler_critic_per_step" in _PLAIN:
        ways["sampler_critic_per_step"] = _PLAIN["sampler_critic_per_step"].collect
    for fn in ways.values():  # warm-up
        fn()
    rates: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(2):
        for name, fn in ways.items():
            rates[name].append(steps_per_s(fn, args.rounds // 2, _PLAIN["per_round"]))
    return {name: statistics.mean(values) for name, values in rates.items()}


def fetch_fragment(worker) -> dict:
    """One fragment end to end: the collect call, then both results into this process."""
    rollout_ref, stats_ref = worker.collect.remote(0)
    return ray.get([rollout_ref, stats_ref])[1][0]


def measure(env_cfg: DictConfig, args) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Env steps/s of each way to collect, one value per repeat; and for the two fleet
    ways, per repeat, the share of their time spent inside ``Sampler.collect``.

    Each repeat starts a fresh plain process and fresh actors: the speed of one process
    varies by several percent from one process to the next (with its memory layout), so
    every repeat draws new ones. The plain process is timed before and after the actors, and
    the bare loop's rate of a repeat is the mean of the two, so the machine's drift over a
    repeat cancels in its ratios."""
    model_cfg = OmegaConf.structured(ModelConfig())
    obs_space, action_space = env_spaces(env_cfg)
    torch.manual_seed(args.seed)
    model = make_actor_critic(obs_space, action_space, model_cfg, env_cfg.normalize_obs).eval()
    weights = model.get_weights()
    fragment = stream_fragment(env_cfg, model_cfg, weights, args)  # for ray_stream, every repeat
    spawn = multiprocessing.get_context("spawn")
    rates: dict[str, list[float]] = {}
    in_collect: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        with spawn.Pool(1, initializer=start_plain, initargs=(env_cfg, model_cfg, weights, args)) as pool:
            before = pool.apply(time_plain)
            bare_s = args.fragment_length * env_cfg.envs_per_sampler / before["bare"]
            measured, shares = measure_actors(env_cfg, model_cfg, weights, fragment, args, bare_s)
            after = pool.apply(time_plain)
        for name in before:  # the plain process before and after the actors: drift cancels
            rates.setdefault(name, []).append((before[name] + after[name]) / 2)
        for name, rate in measured.items():
            rates.setdefault(name, []).append(rate)
        for name, share in shares.items():
            in_collect.setdefault(name, []).append(share)
    return rates, in_collect


def measure_actors(env_cfg: DictConfig, model_cfg: DictConfig, weights: dict, fragment, args,
                   bare_s: float) -> tuple[dict[str, float], dict[str, float]]:
    """Env steps/s of the ways that run in Ray actors, in fresh actors; and the share of
    the fleet ways' time spent inside ``Sampler.collect``. ``bare_s``: the bare loop's
    seconds per fragment, which ``ray_call`` and ``ray_stream`` spend busy; ``fragment``:
    the one ``ray_stream`` puts (``stream_fragment``)."""
    per_round = args.fragment_length * env_cfg.envs_per_sampler
    ps, worker = start_fleet(env_cfg, model_cfg, weights, args)
    sink = Sink.remote()
    streamer = RemoteSampler.options(num_cpus=SAMPLER_CPUS, runtime_env=worker_runtime_env()).remote(
        ps, [SlotSpec(Sampler, fragment_sampler_args(env_cfg, model_cfg, args.fragment_length,
                                                     GAMMA, 0, args.seed,
                                                     bootstrap_value=False),  # as IMPALA's
                      memory=MemoryRef(sink, 0))],
        pin=pin_slot(args))
    bare_actor = BareActor.options(runtime_env=worker_runtime_env()).remote(
        env_cfg, model_cfg, weights, args.seed, pin_slot(args))
    bare_plain_actor = BareActor.remote(env_cfg, model_cfg, weights, args.seed, pin_slot(args))
    busy = Busy.options(runtime_env=worker_runtime_env()).remote(
        pin_slot(args), ps, sink, fragment)
    # (call, fragments per call): the streaming and bare actors run all rounds in one call.
    ways = {"fleet": (lambda: fetch_fragment(worker), 1),
            "stream": (lambda: ray.get(streamer.run.remote(args.rounds)), args.rounds)}
    for name, actor in (("bare_in_actor", bare_actor), ("bare_in_actor_no_preload", bare_plain_actor)):
        ways[name] = (lambda a=actor: ray.get(a.run.remote(args.rounds, args.fragment_length)),
                      args.rounds)
    ways["ray_call"] = (lambda: ray.get(busy.spin.remote(bare_s)), 1)
    ways["ray_stream"] = (lambda: ray.get(busy.stream.remote(args.rounds, bare_s, ASK_SHARE)),
                          args.rounds)
    try:
        fetch_fragment(worker)  # warm-up; the actors also finish starting
        ray.get(streamer.run.remote(2))
        ray.get([a.run.remote(2, args.fragment_length) for a in (bare_actor, bare_plain_actor)])
        ray.get(busy.spin.remote(bare_s))
        ray.get(busy.stream.remote(2, bare_s, ASK_SHARE))
        rates, shares = {}, {}
        for name, (fn, per_call) in ways.items():
            calls = args.rounds // per_call
            seconds, results = timed(fn, calls)
            rates[name] = calls * per_call * per_round / seconds
            if name in ("fleet", "stream"):  # their stats: the seconds inside Sampler.collect
                shares[name] = sum(stats["collect_s"] for stats in results) / seconds
            elif name in ("ray_call", "ray_stream"):  # busy bare_s a fragment; the rest is Ray
                shares[name] = calls * per_call * bare_s / seconds
        return rates, shares
    finally:
        for handle in (worker, streamer, sink, ps, bare_actor, bare_plain_actor, busy):
            ray.kill(handle)


def fragment_split(rates: dict[str, list[float]], in_collect: dict[str, list[float]],
                   per_round: int) -> dict[str, dict[str, float]]:
    """ms per fragment of each fleet way, in all, inside ``Sampler.collect`` and outside it
    (medians over repeats), beside the plain process's collect and bare loop. For
    ``ray_call`` and ``ray_stream``, "in_collect" is their busy time, and "outside_collect"
    what their calls cost."""
    def ms(values) -> float:
        return round(statistics.median(values) * 1e3, 2)

    split = {}
    for name, shares in in_collect.items():
        seconds = [per_round / rate for rate in rates[name]]
        split[name] = {"total": ms(seconds),
                       "in_collect": ms(s * share for s, share in zip(seconds, shares)),
                       "outside_collect": ms(s * (1 - share) for s, share in zip(seconds, shares))}
    for name, way in (("sampler_in_process", "sampler"), ("bare", "bare")):
        split[name] = {"total": ms(per_round / rate for rate in rates[way])}
    return split


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", choices=("cartpole", "halfcheetah", "pong"), default="cartpole",
                   help="env group option from walle_ray/conf/env")
    p.add_argument("--fragment-length", type=int, default=None,
                   help="steps per env per fragment (default 128, CartPole's preset with 2 "
                        "samplers; 20 for Pong, preset=impala_pong's unrolls)")
    p.add_argument("--rounds", type=int, default=None,
                   help="fragments per timed measurement (default: 6400 steps per env, 800 for Pong)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved measurements per way")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="leave the sampler actors free to move between CPUs (topology.pin_samplers=false)")
    p.add_argument("--dry-run", action="store_true", help="print the result instead of writing it")
    args = p.parse_args()
    atari = args.env == "pong"
    if args.fragment_length is None:
        args.fragment_length = default_length(args.env)
    if args.rounds is None:
        args.rounds = max(4, (800 if atari else 6400) // args.fragment_length)

    torch.set_num_threads(1)  # the same single inference thread a sampler uses
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    env_cfg = load_env_cfg(args.env)
    rates, in_collect = measure(env_cfg, args)
    ray.shutdown()

    median = {name: statistics.median(values) for name, values in rates.items()}

    def ratio(way: str, than: str) -> float:
        """Median over repeats of way / than, each repeat's pair measured together."""
        return statistics.median(a / b for a, b in zip(rates[way], rates[than]))

    def slower(way: str, than: str = "bare") -> float:
        return 1 - ratio(way, than)

    overhead, overhead_stream, in_process = slower("fleet"), slower("stream"), slower("sampler")
    in_actor, in_actor_no_preload = slower("bare_in_actor"), slower("bare_in_actor_no_preload")
    # The share of a ray_call's time outside its busy spell (which lasts as long as the
    # bare loop's fragment): the request/response overhead with a sampler that cost nothing.
    floor = statistics.median(1 - share for share in in_collect["ray_call"])
    floor_stream = statistics.median(1 - share for share in in_collect["ray_stream"])
    split_ms = fragment_split(rates, in_collect, args.fragment_length * env_cfg.envs_per_sampler)
    for name, value in median.items():
        print(f"{name:8s} {value:9.1f} env steps/s", flush=True)
    for name, split in split_ms.items():
        print(f"{name:8s} {split}", flush=True)
    print(f"overhead {overhead:.1%} (request/response), {overhead_stream:.1%} (streaming); "
          f"the sampler in a plain process {in_process:.1%}; the bare loop itself runs "
          f"{in_actor:.1%} slower inside a Ray actor ({in_actor_no_preload:.1%} without the preload); "
          f"a bare Ray call around a fragment's worth of work alone costs {floor:.1%}, "
          f"a streaming sampler's calls around it {floor_stream:.1%}")
    critic_speedup = None
    if "sampler_critic_per_step" in rates:
        critic_speedup = ratio("sampler", "sampler_critic_per_step")
        print(f"the sampler running its critic once per fragment makes {critic_speedup:.2f}x the "
              f"env steps/s of one running it every step")
    result = {
        "command": shlex.join(["python", *sys.argv]),
        "target": {"overhead_below": TARGET_OVERHEAD},
        "setup": {"env_id": env_cfg.id, "envs_per_sampler": env_cfg.envs_per_sampler,
                  "fragment_length": args.fragment_length, "rounds": args.rounds,
                  "repeats": args.repeats, "model": "ModelConfig defaults", "torch_threads": 1,
                  "samplers_pinned": args.pin},
        "env_steps_per_s": rates,
        "env_steps_per_s_median": median,
        # Each a median over repeats of 1 - rate / the bare loop's rate in the same repeat.
        "overhead": overhead,
        "overhead_streaming": overhead_stream,
        "overhead_sampler_in_process": in_process,
        "speedup_of_the_batched_critic": critic_speedup,
        # Diagnostics: the bare loop itself inside a Ray actor process, and the fleet paths
        # measured against that rather than against the plain process.
        "slowdown_bare_in_actor": in_actor,
        "slowdown_bare_in_actor_no_preload": in_actor_no_preload,
        "overhead_vs_bare_in_actor": slower("fleet", "bare_in_actor"),
        "overhead_streaming_vs_bare_in_actor": slower("stream", "bare_in_actor"),
        # The floor of request/response on this machine: one Ray call to an actor that only
        # spins for the bare loop's time per fragment, its time beyond the spin as a share.
        "overhead_floor_request_response": floor,
        # The same for streaming: the weights ask and the fragment's put around that work.
        "overhead_floor_streaming": floor_stream,
        # Per fragment of each fleet way, ms inside Sampler.collect (in the actor) and ms
        # outside it (Ray calls, transfers, weights), from the medians over repeats; and
        # the plain process's collect (which, as PPO's, values the last observation too).
        "ms_per_fragment": split_ms,
        "met_target": overhead < TARGET_OVERHEAD,
        "met_target_streaming": overhead_stream < TARGET_OVERHEAD,
    }
    name = "sampling_overhead" if args.env == "cartpole" else f"sampling_overhead_{args.env}"
    if args.fragment_length != default_length(args.env):
        name += f"_f{args.fragment_length}"
    if not args.pin:
        name += "_nopin"
    write_result(name, result, args.dry_run)


if __name__ == "__main__":
    main()
