"""A run's plan against the machine, before any role starts: what the memories hold once
full (estimated from how they store rows, checked here against what they allocate), the
role processes, their CPU shares, and the one-line refusals that name ``topology`` or the
memories' setting with what would fit. The shipped presets fit a machine like the one CI
runs on."""

from __future__ import annotations

import gc
import tracemalloc

import gymnasium as gym
import numpy as np
import pytest

from walle_ray.batch import Rollout, Transitions, rollout_row_bytes
from walle_ray.buffers.mixed import BufferSpec, MixedMemory
from walle_ray.buffers.prioritized import PrioritizedReplay
from walle_ray.config import ConfigError
from walle_ray.memory_plan import (GIB, ROLE_PROCESS_BYTES, MemoryEstimate, MemoryNeed,
                                   check_memory, check_memory_nodes)

from conftest import ROOT, make_cfg, run_cli

CPUS = 2  # the machine CI runs on: 2 cores, 24 GiB
AVAILABLE = 16 * GIB  # what such a machine has available, with room to spare
STACK, N_STEP = 4, 3


def held_bytes(fill) -> tuple[int, int]:
    """(bytes allocated once ``fill(capacity)`` returns, the most allocated meanwhile), as
    Python's allocator and numpy report them to tracemalloc; a small fill first makes what
    the first call of anything keeps (caches, lazy imports)."""
    fill(64)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        kept = fill(None)
        gc.collect()
        now, peak = tracemalloc.get_traced_memory()
        del kept
    finally:
        tracemalloc.stop()
    return now - base, peak - base


def transitions(rng, n: int, obs_shape: tuple, episode: int = 32) -> Transitions:
    """``n`` 3-step transitions: vectors, or frame stacks from episodes of ``episode`` steps
    whose consecutive stacks share frames, as an Atari env's do."""
    if len(obs_shape) == 3:
        obs, next_obs = [], []
        while len(obs) < n:
            frames = rng.integers(0, 256, (episode + STACK + N_STEP, *obs_shape[1:]), np.uint8)
            obs += [frames[t:t + STACK] for t in range(episode)]
            next_obs += [frames[t + N_STEP:t + N_STEP + STACK] for t in range(episode)]
        obs, next_obs, action = np.stack(obs[:n]), np.stack(next_obs[:n]), np.zeros(n, np.int64)
    else:
        obs = rng.standard_normal((n, *obs_shape)).astype(np.float32)
        next_obs, action = obs + 1, rng.standard_normal((n, 6)).astype(np.float32)
    return Transitions(obs=obs, action=action, reward=np.zeros(n, np.float32),
                       discount=np.ones(n, np.float32), next_obs=next_obs,
                       priority=np.ones(n, np.float32), version_b=np.zeros(n, np.int64))


@pytest.mark.parametrize("obs_shape", [(17,), (STACK, 42, 42)], ids=["vector", "frames"])
def test_a_replay_shard_holds_what_its_plan_says(obs_shape):
    """Frame stacks: each distinct frame once, and the store's arrays while they grow past
    the capacity, old and new at once; vectors: both observations of every transition."""
    capacity, rng = 4000, np.random.default_rng(0)
    frames = len(obs_shape) == 3
    action = ((), np.int64) if frames else ((6,), np.float32)

    def fill(size):
        shard = PrioritizedReplay(size or capacity, 32, learning_starts=0)
        for _ in range(2 * (size or capacity) // 64):
            shard.put(transitions(rng, 64, obs_shape))
        return shard

    now, peak = held_bytes(fill)
    planned = PrioritizedReplay.planned_bytes(capacity, (obs_shape, np.uint8 if frames
                                                         else np.float32), action)
    assert 0.8 * peak <= planned <= 1.2 * peak, (planned, peak, now)


def rollout(rng, steps: int, rows: int, obs_shape: tuple, dtype) -> Rollout:
    """A fragment of ``rows`` env columns with a Discrete(6) policy's parameters."""
    def zeros(*shape, kind=np.float32):
        return np.zeros(shape, kind)

    obs = rng.integers(0, 255, (steps, rows, *obs_shape)).astype(dtype)
    return Rollout(obs_t=obs, action_t=zeros(steps, rows, kind=np.int64),
                   reward_t=zeros(steps, rows), terminated_t=zeros(steps, rows, kind=bool),
                   truncated_t=zeros(steps, rows, kind=bool), logp_t=zeros(steps, rows),
                   dist_t=zeros(steps, rows, 6), v_t=zeros(steps, rows),
                   final_v_t=zeros(steps, rows), final_obs=zeros(0, *obs_shape, kind=dtype),
                   return_t=zeros(steps, rows), last_obs=obs[-1].copy(), last_v=zeros(rows),
                   version_b=zeros(rows, kind=np.int64), replayed_b=zeros(rows, kind=bool))


@pytest.mark.parametrize("obs_shape,dtype,rows", [((4,), np.float32, 1), ((4,), np.float32, 8),
                                                  ((STACK, 42, 42), np.uint8, 4)],
                         ids=["vector-1", "vector-8", "frames-4"])
def test_a_memory_mix_holds_what_its_plan_says(obs_shape, dtype, rows):
    """An IMPALA memory holds its largest buffer's rows, each a row's arrays and the
    Python objects around them."""
    capacity, steps, rng = 600, 20, np.random.default_rng(0)
    specs = [BufferSpec("queue", 0.5, 16), BufferSpec("uniform", 0.5, capacity)]

    def fill(size):
        memory = MixedMemory([specs[0], BufferSpec("uniform", 0.5, size)] if size else specs, 8)
        for _ in range(2 * (size or capacity) // rows):
            fragment = rollout(rng, steps, rows, obs_shape, dtype)
            if not memory.has_room(fragment):
                memory.sample()
            memory.put(fragment)
        return memory

    now, _ = held_bytes(fill)
    row = rollout_row_bytes(steps, (obs_shape, dtype), ((), np.int64), 6)
    planned = MixedMemory.planned_bytes(specs, row, rows)
    assert 0.8 * now <= planned <= 1.2 * now, (planned, now)


def plan_of(*overrides: str, cpus: float = CPUS):
    """(the algorithm, the logical topology, the process counts, the memory estimate) a run
    of ``overrides`` makes on ``cpus`` CPUs, with its CPU shares checked."""
    from walle_ray.algos import algorithm_for
    from walle_ray.runtime.plan import estimate, plan_cpus, plan_processes
    from walle_ray.topology import Topology, parse_topology

    cfg = make_cfg(*overrides)
    algo, topo = algorithm_for(cfg.algo), parse_topology(cfg.topology.spec)
    if topo.local:
        processes = Topology(0, 0, 0, 0)
    else:
        processes = plan_processes(cfg, algo, topo, cpus)[1]
        plan_cpus(cfg, algo, topo, processes, cpus, [{"CPU": float(cpus)}])
    obs_space, action_space = spaces(cfg.env)
    return algo, topo, processes, estimate(cfg, algo, processes.total, obs_space, action_space)


_SPACES: dict = {}


def spaces(env_cfg) -> tuple[gym.Space, gym.Space]:
    """The env's spaces, made once per env and frame size in a test session."""
    from walle_ray.envs import env_spaces

    key = (env_cfg.id, env_cfg.obs_size, env_cfg.frame_stack)
    if key not in _SPACES:
        _SPACES[key] = env_spaces(env_cfg)
    return _SPACES[key]


def test_a_capacity_that_does_not_fit_is_refused_in_one_line_with_what_fits():
    overrides = ("algo=dqn", "env=cartpole", "algo.capacity=10000000000")
    *_, plan = plan_of(*overrides)
    with pytest.raises(ConfigError) as refused:
        check_memory(plan, 21 * GIB, "this machine", "2a1m1l1p", "use fewer")
    message = str(refused.value)
    assert "\n" not in message and message.startswith("algo.capacity=10000000000: the memories")
    assert "more than the 21.0 GiB available on this machine" in message
    fit = int(message.rsplit("algo.capacity=", 1)[1].split()[0])
    assert plan_of("algo=dqn", "env=cartpole", f"algo.capacity={fit}")[3].total <= 21 * GIB
    more = plan_of("algo=dqn", "env=cartpole", f"algo.capacity={int(fit * 1.01)}")[3]
    assert more.total > 21 * GIB


def test_the_setting_that_holds_more_is_the_one_named():
    memories = MemoryNeed("algo.capacity", 1000, lambda rows: rows * 30 * GIB / 1000)
    with pytest.raises(ConfigError, match=r"^algo\.capacity=1000: .* algo\.capacity=\d+ fits$"):
        check_memory(MemoryEstimate(5, (memories,)), 20 * GIB, "this machine", "2a1m1l1p", "x")
    small = MemoryNeed("algo.capacity", 1000, lambda rows: rows * GIB / 1000)
    with pytest.raises(ConfigError, match=r"^topology=512a64m64l1p: 641 role processes of about "
                       r"200 MiB each would hold about 125\.2 GiB \(with the memories, 126\.2 "
                       r"GiB\), more than the 20\.0 GiB available on this machine; at most 97 "
                       r"role processes fit: use topology\.pack=auto$"):
        check_memory(MemoryEstimate(641, (small,)), 20 * GIB, "this machine", "512a64m64l1p",
                     "use topology.pack=auto")
    check_memory(MemoryEstimate(5, (small,)), 20 * GIB, "this machine", "2a1m1l1p", "x")


def test_a_memory_process_must_fit_on_one_node():
    need = MemoryNeed("algo.capacity", 1000, lambda rows: rows * 8 * GIB / 1000, memories=2)
    check_memory_nodes((need,), [5 * GIB, 1 * GIB])
    with pytest.raises(ConfigError, match=r"^algo\.capacity=1000: one memory process would hold "
                       r"about 8\.2 GiB, more than the 5\.0 GiB of the largest node that may "
                       r"run it; algo\.capacity=\d+ fits, or give the topology more memories$"):
        check_memory_nodes((need,), [5 * GIB, 1 * GIB], per_process=2)


def test_hundreds_of_processes_on_two_cpus_are_refused_naming_topology_pack():
    with pytest.raises(ConfigError, match=r"^topology=512a64m64l1p: 641 role processes on 2 CPUs "
                       r"leave each sampler process 0\.0006 CPU, less than the 0\.01 of a process "
                       r"that mostly waits; use topology\.pack=auto \(4 role processes on 2 "
                       r"CPUs\)$"):
        plan_of("algo=impala", "topology.spec=512a64m64l", "topology.pack=off",
                "algo.batch_size=512")
    # many processes, but each with a share it can work with
    assert plan_of("algo=impala", "env=pong", "topology=32a4m4l",
                   "topology.pack=off")[2].total == 41
    with pytest.raises(ConfigError, match=r"topology\.pack=auto"):
        plan_of("topology.spec=400a1m1l", "topology.pack=300")


def test_es_noise_table_is_counted_twice_and_named_when_it_does_not_fit():
    *_, plan = plan_of("algo=es", "env=cartpole", "algo.noise_size=10000000000")
    assert plan.memory_bytes == 2 * 4 * 10_000_000_000  # the shared table and the learner's
    with pytest.raises(ConfigError, match=r"^algo\.noise_size=10000000000: .* "
                       r"algo\.noise_size=\d+ fits$"):
        check_memory(plan, AVAILABLE, "this machine", "2a1m1l1p", "-")


def test_a_parameter_server_the_user_places_keeps_its_process():
    """Planned for fewer CPUs than samplers and learners, learner 0 keeps the weights, unless
    ``topology.resources.ps`` places the parameter server."""
    assert plan_of("algo=impala", "topology=2a1m1l")[2].param_servers == 0
    assert plan_of("algo=impala", "topology=2a1m1l", "topology.pack=off")[2].param_servers == 1
    placed = plan_of("algo=impala", "topology=2a1m1l", "+topology.resources={ps: {walle_ps: 1}}")
    assert placed[2].param_servers == 1 and placed[2].total == 5


def test_es_packs_its_samplers_and_starts_no_memory_process():
    _, _, packed, _ = plan_of("algo=es", "env=cartpole", "topology.spec=64a4m1l")
    assert (packed.samplers, packed.memories, packed.learners, packed.param_servers) == (2, 0, 1, 0)
    _, _, off, _ = plan_of("algo=es", "env=cartpole", "topology.spec=64a4m1l", "topology.pack=off")
    assert off.total == 66


def shipped():
    """Each shipped preset with the topology it runs on by default, and the commands the
    configs' help gives."""
    presets = sorted(p.stem for p in (ROOT / "walle_ray" / "conf" / "preset").glob("*.yaml"))
    envs = sorted(p.stem for p in (ROOT / "walle_ray" / "conf" / "env").glob("*.yaml"))
    for preset in presets:
        env = next((e for e in envs if preset.endswith(f"_{e}") or f"_{e}_" in preset), None)
        algo = preset[:preset.index(f"_{env}")]
        offline = ["topology.spec=0a1m1l"] if algo in ("bc", "marwil") else []  # no samplers
        yield pytest.param([f"algo={algo}", f"env={env}", f"preset={preset}", *offline],
                           id=preset)
    for command in ("algo=impala env=pong topology=32a4m4l", "algo=apex env=pong topology=4a8m1l",
                    "algo=ppo env=halfcheetah topology=8a1m1l", "algo=dqn env=pong",
                    "algo=impala env=pong topology=16a2m2l", "algo=impala env=pong topology=local"):
        yield pytest.param(command.split(), id=command.replace(" ", ","))


@pytest.mark.parametrize("overrides", shipped())
def test_shipped_presets_fit_a_machine_like_this_one(overrides):
    *_, plan = plan_of(*overrides)
    check_memory(plan, AVAILABLE, "this machine", "shipped", "-")
    assert plan.total < AVAILABLE / 2, plan.describe()


def test_the_role_process_figure_is_the_measured_one():
    """The constant is the one docs/performance.md gives with the command that measured it."""
    text = (ROOT / "docs" / "performance.md").read_text()
    assert f"{ROLE_PROCESS_BYTES / 2**20:.0f} MiB" in text
    assert "benchmarks/role_footprint.py" in text


def test_a_capacity_in_scientific_notation_that_does_not_fit_is_one_line_on_the_command_line():
    proc = run_cli("algo=dqn", "env=cartpole", "topology=local", "algo.capacity=1e10",
                   "hydra.run.dir=/tmp/walle_ray_capacity_refused", check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "walle_ray: error: algo.capacity=10000000000: the memories would hold about"), lines
    assert lines[0].endswith(" fits")


def test_hundreds_of_processes_are_one_line_on_the_command_line():
    proc = run_cli("algo=impala", "topology=512a64m64l", "topology.pack=off",
                   "algo.batch_size=512", "hydra.run.dir=/tmp/walle_ray_processes_refused",
                   check=False, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "walle_ray: error: topology=512a64m64l1p: 641 role processes "), lines
    assert "use topology.pack=auto" in lines[0]


def test_on_a_cluster_the_memory_ray_reports_for_the_nodes_is_what_must_hold_the_plan():
    """The plan against the nodes' memory together, and each memory process against the
    largest node that may run it (a replay shard cannot span nodes)."""
    from walle_ray.algos import algorithm_for
    from walle_ray.runtime.plan import check_plan_memory, plan_processes
    from walle_ray.topology import parse_topology

    cfg = make_cfg("algo=apex", "env=pong", "topology=4a8m1l")  # shards of 2.3 GiB in all
    algo, topo = algorithm_for(cfg.algo), parse_topology(cfg.topology.spec)
    obs_space, action_space = spaces(cfg.env)
    packing, processes = plan_processes(cfg, algo, topo, 4)
    assert len(packing.memories) == 2  # 4 shards in each memory process

    def check(node_gib: list[float]) -> None:
        nodes = [{"CPU": 1.0, "memory": gib * GIB} for gib in node_gib]
        check_plan_memory(cfg, algo, topo, packing, processes, 4, obs_space, action_space,
                          nodes)

    check([4.0] * 4)
    with pytest.raises(ConfigError, match=r"^algo\.capacity=500000: .* more than the 2\.4 GiB "
                       r"available on the cluster's 4 nodes; algo\.capacity=\d+ fits$"):
        check([0.6] * 4)
    with pytest.raises(ConfigError, match=r"^algo\.capacity=500000: one memory process would "
                       r"hold about \d\.\d GiB, more than the 0\.9 GiB of the largest node that "
                       r"may run it; algo\.capacity=\d+ fits, or give the topology more "
                       r"memories$"):
        check([0.9] * 6)
    # memory processes go only where topology.resources lets them: those nodes must hold one
    confined = make_cfg("algo=apex", "env=pong", "topology=4a8m1l",
                        "topology.resources={memory: {big: 1}}")
    small, large = {"CPU": 1.0, "memory": 0.9 * GIB}, {"CPU": 1.0, "memory": 4 * GIB}
    check_plan_memory(confined, algo, topo, packing, processes, 4, obs_space, action_space,
                      [small] * 5 + [{**large, "big": 1}])
    with pytest.raises(ConfigError, match="one memory process would hold"):
        check_plan_memory(confined, algo, topo, packing, processes, 4, obs_space, action_space,
                          [{**small, "big": 1}] * 5 + [large])
