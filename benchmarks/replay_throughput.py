"""Replay shard throughput: inserts/s and batches/s of ``PrioritizedReplay``, alone and under Ray.

    python benchmarks/replay_throughput.py [--seconds 4] [--capacity 100000]
                                           [--fleet-capacity 20000] [--dry-run]

Pong-sized transitions: uint8 ``obs`` and ``next_obs`` [4, 84, 84] and int64 actions, about
56 KB each as stacks; samplers' fragments of 256 transitions (8 envs x 32 steps of 3-step
transitions over each env's stream of random frames, so stacks overlap as a real env's do;
the shard holds each distinct frame once), learner batches of 512.

  local   one prioritized shard in this process: inserts/s filling it to capacity, then
          batches/s of ``sample`` + ``feedback`` (new priorities) with one fragment put per batch;
  actor   the shard as a Ray actor (``ray.remote(PrioritizedReplay)``): a driver thread keeps
          two puts in flight while the main loop keeps two batch requests in flight and sends
          each batch's priorities back, as a learner with ``prefetch=2`` does;
  fleet   8 smaller shard actors, prefilled, read round robin by one learner loop with two
          batch requests in flight.

Fragments are put into the object store once and their refs reused, so the driver does not
pay for serialising them; every shard still copies each put in. Writes
benchmarks/results/replay_throughput.json.

Target: one shard (the actor) serves at least 20 batches of 512 per second while taking inserts.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import threading
import time
from collections import deque

import numpy as np
import ray

from common import write_result
from walle_ray.batch import Priorities, Transitions
from walle_ray.buffers.prioritized import PrioritizedReplay

TARGET_BATCHES_PER_S = 20
OBS_SHAPE = (4, 84, 84)
FRAGMENT = 256
BATCH = 512
DISTINCT_FRAGMENTS = 8
ENVS, N_STEP = 8, 3  # a fragment: ENVS envs x FRAGMENT // ENVS steps
IN_FLIGHT = 2
FLEET_SHARDS = 8
FLEET_PREFILL = 4096  # transitions per fleet shard before it is read
ACTOR_PREFILL = 10_240  # transitions in the actor shard before batches are timed
SHARD_CPUS = 0.1

RemoteShard = ray.remote(PrioritizedReplay)


def make_fragments(rng: np.random.Generator) -> list[Transitions]:
    """Distinct fragments of random frames, in the order a sampler emits them (step-major
    over its envs); a tenth of the rows come without a priority."""
    fragments = []
    steps, stack = FRAGMENT // ENVS, OBS_SHAPE[0]
    for _ in range(DISTINCT_FRAGMENTS):
        frames = rng.integers(0, 256, (ENVS, steps + N_STEP + stack - 1, *OBS_SHAPE[1:]), np.uint8)
        obs = np.stack([frames[:, t:t + stack] for t in range(steps)], 1).reshape(-1, *OBS_SHAPE)
        next_obs = np.stack([frames[:, t + N_STEP:t + N_STEP + stack] for t in range(steps)],
                            1).reshape(-1, *OBS_SHAPE)
        priority = rng.exponential(size=FRAGMENT).astype(np.float32)
        priority[rng.random(FRAGMENT) < 0.1] = np.nan
        fragments.append(Transitions(
            obs=obs, action=rng.integers(0, 6, FRAGMENT),
            reward=rng.normal(size=FRAGMENT).astype(np.float32),
            discount=np.full(FRAGMENT, 0.99 ** 3, np.float32), next_obs=next_obs,
            priority=priority, version_b=np.zeros(FRAGMENT, np.int64)))
    return fragments


def td_errors(rng: np.random.Generator) -> np.ndarray:
    return rng.exponential(size=BATCH).astype(np.float32)


def measure_local(fragments: list[Transitions], capacity: int, seconds: float, seed: int) -> dict:
    """Fill one shard to capacity (inserts/s), then time batches with a put between each."""
    rng = np.random.default_rng(seed)
    shard = PrioritizedReplay(capacity, BATCH, learning_starts=BATCH, seed=seed)
    t0 = time.perf_counter()
    held = None  # frames held per transition once every distinct fragment is in
    while shard.inserted < capacity:
        shard.put(fragments[(shard.inserted // FRAGMENT) % DISTINCT_FRAGMENTS])
        if held is None and shard.inserted >= DISTINCT_FRAGMENTS * FRAGMENT:
            held = shard.stats()["frames"] / len(shard)
    inserts_per_s = shard.inserted / (time.perf_counter() - t0)

    batches, put_before = 0, shard.inserted
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        shard.put(fragments[batches % DISTINCT_FRAGMENTS])
        batch = shard.sample()
        shard.feedback(Priorities(batch.index, td_errors(rng)))
        batches += 1
    return {"capacity": capacity, "inserts_per_s": inserts_per_s,
            "frames_per_transition": held,  # 2 x 4 = 8 as stacks
            "obs_bytes_per_transition": held * int(np.prod(OBS_SHAPE[1:])) + 2 * OBS_SHAPE[0] * 4,
            "obs_bytes_per_transition_as_stacks": 2 * int(np.prod(OBS_SHAPE)),
            "batches_per_s_with_puts": batches / elapsed,
            "inserts_per_s_while_sampling": (shard.inserted - put_before) / elapsed,
            "stats": shard.stats()}


def insert_until(shard, refs: list, stop: threading.Event, counter: list[int]) -> None:
    """Keep ``IN_FLIGHT`` puts on ``shard`` until ``stop``; ``counter[0]`` counts finished ones."""
    pending: deque = deque()
    i = 0
    while not stop.is_set():
        while len(pending) < IN_FLIGHT:
            pending.append(shard.put.remote(refs[i % len(refs)]))
            i += 1
        ray.get(pending.popleft())
        counter[0] += 1
    ray.get(list(pending))


def read_batches(shards: list, seconds: float, rng: np.random.Generator) -> tuple[int, float]:
    """A learner loop: round robin over ``shards``, ``IN_FLIGHT`` requests, priorities sent back."""
    pending: deque = deque()
    batches, k = 0, 0
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        while len(pending) < IN_FLIGHT:
            shard = shards[k % len(shards)]
            pending.append((shard, shard.sample.remote()))
            k += 1
        shard, ref = pending.popleft()
        batch = ray.get(ref)
        shard.feedback.remote(Priorities(batch.index, td_errors(rng)))
        batches += 1
    ray.get([ref for _, ref in pending])
    return batches, elapsed


def prefill(shards: list, refs: list, transitions: int) -> None:
    ray.get([shard.put.remote(refs[i % len(refs)])
             for shard in shards for i in range(transitions // FRAGMENT)])


def measure_actor(refs: list, capacity: int, seconds: float, seed: int) -> dict:
    """One shard actor taking puts from a driver thread while the main loop reads batches."""
    shard = RemoteShard.options(num_cpus=SHARD_CPUS).remote(
        capacity, BATCH, learning_starts=BATCH, seed=seed)
    prefill([shard], refs, ACTOR_PREFILL)
    size_before = ray.get(shard.stats.remote())["size"]
    stop, puts = threading.Event(), [0]
    inserter = threading.Thread(target=insert_until, args=(shard, refs, stop, puts))
    inserter.start()
    batches, elapsed = read_batches([shard], seconds, np.random.default_rng(seed))
    stop.set()
    inserter.join()
    stats = ray.get(shard.stats.remote())
    ray.kill(shard)
    return {"capacity": capacity, "batches_per_s": batches / elapsed,
            "inserts_per_s": puts[0] * FRAGMENT / elapsed, "size_before": size_before,
            "stats": stats}


def measure_fleet(refs: list, capacity: int, seconds: float, seed: int) -> dict:
    """``FLEET_SHARDS`` prefilled shard actors read by one learner loop."""
    shards = [RemoteShard.options(num_cpus=SHARD_CPUS).remote(
        capacity, BATCH, learning_starts=BATCH, seed=seed + i) for i in range(FLEET_SHARDS)]
    prefill(shards, refs, FLEET_PREFILL)
    batches, elapsed = read_batches(shards, seconds, np.random.default_rng(seed))
    sizes = [s["size"] for s in ray.get([shard.stats.remote() for shard in shards])]
    for shard in shards:
        ray.kill(shard)
    return {"shards": FLEET_SHARDS, "capacity_per_shard": capacity, "size_per_shard": sizes,
            "batches_per_s": batches / elapsed, "transitions_per_s": batches * BATCH / elapsed}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds per measurement")
    p.add_argument("--capacity", type=int, default=100_000,
                   help="transitions in the local and actor shard")
    p.add_argument("--fleet-capacity", type=int, default=20_000, help="transitions per fleet shard")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the result instead of writing it")
    args = p.parse_args()

    load_before = os.getloadavg()[0]  # other work on the machine shares its cores
    fragments = make_fragments(np.random.default_rng(args.seed))
    local = measure_local(fragments, args.capacity, args.seconds, args.seed)
    print(f"local  {local['inserts_per_s']:9.0f} inserts/s filling, "
          f"{local['batches_per_s_with_puts']:6.1f} batches/s with puts", flush=True)

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    refs = [ray.put(fragment) for fragment in fragments]
    del fragments
    actor = measure_actor(refs, args.capacity, args.seconds, args.seed)
    print(f"actor  {actor['batches_per_s']:6.1f} batches/s, "
          f"{actor['inserts_per_s']:9.0f} inserts/s", flush=True)
    fleet = measure_fleet(refs, args.fleet_capacity, args.seconds, args.seed)
    print(f"fleet  {fleet['batches_per_s']:6.1f} batches/s from {FLEET_SHARDS} shards", flush=True)
    ray.shutdown()
    load = [load_before, os.getloadavg()[0]]

    transition_bytes = 2 * int(np.prod(OBS_SHAPE)) + 8 + 4 + 4 + 8
    result = {
        "command": shlex.join(["python", *sys.argv]),
        "target": {"batches_per_s_at_least": TARGET_BATCHES_PER_S, "batch_size": BATCH,
                   "measured_on": "actor"},
        "setup": {"obs_shape": list(OBS_SHAPE), "obs_dtype": "uint8", "action_dtype": "int64",
                  "transition_bytes": transition_bytes, "fragment": FRAGMENT, "batch_size": BATCH,
                  "in_flight": IN_FLIGHT, "seconds": args.seconds, "shard_num_cpus": SHARD_CPUS,
                  "actor_prefill": ACTOR_PREFILL, "fleet_prefill": FLEET_PREFILL,
                  "ray_num_cpus": 2, "load_average_1m_start_end": load},
        "local": local,
        "actor": actor,
        "fleet": fleet,
        "met_target": actor["batches_per_s"] >= TARGET_BATCHES_PER_S,
    }
    write_result("replay_throughput", result, args.dry_run)


if __name__ == "__main__":
    main()
