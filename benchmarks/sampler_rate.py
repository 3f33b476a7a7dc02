"""One sampler in this process: env steps/s of ``Sampler.collect`` as an algorithm builds it.

    python benchmarks/sampler_rate.py [--seconds 5] algo=apex env=cartpole [key=value ...]

Composes the config as ``python -m walle_ray <overrides>`` would (topology 2a1m1l unless
given), builds sampler 0 from the algorithm's ``sampler_spec`` with a fresh learner's
weights, collects three fragments to warm up, then as many as fit in ``--seconds``; prints
one JSON line. ``versions_ab.py`` runs it in two versions of the code, alternately.
"""

from __future__ import annotations

import argparse
import json
import time

from hydra import compose, initialize_config_dir


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()

    from walle_ray.config import CONF_DIR
    from walle_ray.algos import algorithm_for
    from walle_ray.algos import register_configs
    from walle_ray.envs import env_spaces
    from walle_ray.topology import parse_topology

    from walle_ray.runtime.process import prepare_process

    prepare_process(torch_threads=1)  # as a sampler process does
    register_configs()
    with initialize_config_dir(str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=["topology=2a1m1l", *args.overrides])
    topo = parse_topology(cfg.topology.spec)
    algo = algorithm_for(cfg.algo)
    cls, spec_args, kwargs = algo.sampler(cfg, topo, 0)
    sampler = cls(*spec_args, **kwargs)
    version, weights = algo.build_learner(cfg, *env_spaces(cfg.env)).weights()
    sampler.set_weights(weights, version)
    for _ in range(3):
        sampler.collect()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < args.seconds:
        steps += sampler.collect()[1]["env_steps"]
    sampler.close()
    print(json.dumps({"env_steps_per_s": steps / (time.perf_counter() - t0)}))


if __name__ == "__main__":
    main()
