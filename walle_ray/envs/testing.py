"""Small deterministic environments for tests and benchmarks.

Registered with gymnasium as ``walle/Counting-v0``, ``walle/Recall-v0``,
``walle/CartPoleNoVelocity-v0``, ``walle/Sleep-v0``, ``walle/Faulty-v0``, ``walle/Frames-v0``,
``walle/Continuous-v0``, ``walle/DictObs-v0``, ``walle/MultiDiscrete-v0``,
``walle/MultiBinary-v0``, and the masked envs of ``envs/games.py`` (``walle/Othello-v0``,
``walle/RandomMask-v0``) so they go through the same ``env.id=...`` path as any other env.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np

from walle_ray.pulse import PULSE


class CountingEnv(gym.Env):
    """Observation is [step-in-episode]; reward 1 per step; ends after ``length`` steps.

    ``truncate=True`` ends by truncation instead of termination. Data is predictable, so
    tests can check shapes, ordering and bootstrapping exactly.
    """

    def __init__(self, length: int = 10, truncate: bool = False):
        self.length = length
        self.truncate = truncate
        self.observation_space = gym.spaces.Box(0, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        return (np.array([self.t], np.float32), 1.0,
                end and not self.truncate, end and self.truncate, {})


class RecallEnv(gym.Env):
    """A memory task no feed-forward policy can solve: the first observation shows a cue
    (one of two, at random), the next ``delay`` steps show nothing, and the last step asks
    for it. Observations are [cue is 0, cue is 1, asking]; the answer (the action on the
    asking step) earns +1 when it names the cue and -1 otherwise; other steps earn 0. A
    policy that remembers scores 1 per episode, one that cannot 0 on average."""

    def __init__(self, delay: int = 4):
        self.delay = delay
        self.observation_space = gym.spaces.Box(0, 1, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t, self.cue = 0, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.cue = 0, int(self.np_random.integers(2))
        obs = np.zeros(3, np.float32)
        obs[self.cue] = 1.0
        return obs, {}

    def step(self, action):
        asked = self.t == self.delay + 1
        self.t += 1
        obs = np.zeros(3, np.float32)
        obs[2] = float(self.t == self.delay + 1)
        reward = (1.0 if int(action) == self.cue else -1.0) if asked else 0.0
        return obs, reward, asked, False, {}


def cartpole_no_velocity(**kwargs) -> gym.Env:
    """CartPole-v1 showing only the cart's position and the pole's angle: the velocities
    must be inferred from successive observations, which a recurrent policy can do and a
    feed-forward one cannot (a POMDP for benchmarks/recurrent.py)."""
    env = gym.make("CartPole-v1", **kwargs)
    low, high = env.observation_space.low[[0, 2]], env.observation_space.high[[0, 2]]
    return gym.wrappers.TransformObservation(
        env, lambda obs: obs[[0, 2]], gym.spaces.Box(low, high, dtype=np.float32))


class SleepEnv(gym.Env):
    """A slow simulator: each step waits ``step_s`` seconds without using the CPU."""

    def __init__(self, step_s: float = 0.005, length: int = 200, obs_dim: int = 8):
        self.step_s = step_s
        self.length = length
        self.observation_space = gym.spaces.Box(-1, 1, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample() * 0, {}

    def step(self, action):
        time.sleep(self.step_s)
        self.t += 1
        obs = np.full(self.observation_space.shape, np.sin(self.t), np.float32)
        return obs, float(action), False, self.t >= self.length, {}


class FramesEnv(gym.Env):
    """Stand-in for an Atari env: ``stack`` stacked uint8 frames of ``size`` x ``size`` (the
    observation layout of ``AtariEnv``), ``num_actions`` discrete actions, ``length`` steps.

    Each new frame shows one bright row that moves down a step at a time, so consecutive
    observations share ``stack - 1`` frames as real frame stacks do. Reward 1 when the action
    is ``t mod num_actions``, else 0, so returns and values vary with the policy.
    """

    def __init__(self, stack: int = 4, size: int = 42, num_actions: int = 6, length: int = 20,
                 truncate: bool = False):
        self.stack, self.size, self.length, self.truncate = stack, size, length, truncate
        self.observation_space = gym.spaces.Box(0, 255, (stack, size, size), np.uint8)
        self.action_space = gym.spaces.Discrete(num_actions)
        self.t = 0
        self.frames = np.zeros((stack, size, size), np.uint8)

    def _frame(self) -> np.ndarray:
        frame = np.zeros((self.size, self.size), np.uint8)
        frame[self.t % self.size] = 255
        return frame

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.frames = np.repeat(self._frame()[None], self.stack, axis=0)
        return self.frames.copy(), {}

    def step(self, action):
        reward = 1.0 if int(action) == self.t % self.action_space.n else 0.0
        self.t += 1
        self.frames = np.concatenate([self.frames[1:], self._frame()[None]])
        end = self.t >= self.length
        return self.frames.copy(), reward, end and not self.truncate, end and self.truncate, {}


class ContinuousEnv(gym.Env):
    """Stand-in for a continuous-control env: a point in ``obs_dim`` dimensions pushed by
    bounded actions in ``act_dim`` (within ``low`` and ``high``, scalars or lists), rewarded
    for staying near the origin. Episodes end by truncation after ``length`` steps, as
    MuJoCo's time limits do (``truncate=False`` terminates instead)."""

    def __init__(self, obs_dim: int = 3, act_dim: int = 1, low=-1.0, high=1.0, length: int = 20,
                 truncate: bool = True):
        self.length, self.truncate = length, truncate
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(np.asarray(low, np.float32) * np.ones(act_dim, np.float32),
                                           np.asarray(high, np.float32) * np.ones(act_dim, np.float32),
                                           dtype=np.float32)
        self.t = 0
        self.x = np.zeros(obs_dim, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.x = self.np_random.uniform(-1, 1, self.x.shape).astype(np.float32)
        return self.x.copy(), {}

    def step(self, action):
        action = np.clip(np.asarray(action, np.float32), self.action_space.low,
                         self.action_space.high)
        k = min(len(action), len(self.x))
        self.x = 0.9 * self.x
        self.x[:k] += 0.1 * action[:k]
        self.t += 1
        reward = -float(np.square(self.x).sum()) - 0.01 * float(np.square(action).sum())
        end = self.t >= self.length
        return self.x.copy(), reward, end and not self.truncate, end and self.truncate, {}


class DictObsEnv(gym.Env):
    """A Dict observation: ``goal`` (Discrete(n)) and ``noise`` (a Box the reward ignores).
    Reward 1 when the action equals the goal, else 0; a new goal each step; ``length``
    steps (truncated). Random play scores ``length / n``, the right policy ``length``."""

    def __init__(self, n: int = 3, length: int = 20):
        self.n, self.length = n, length
        self.observation_space = gym.spaces.Dict({
            "goal": gym.spaces.Discrete(n), "noise": gym.spaces.Box(-1, 1, (2,), np.float32)})
        self.action_space = gym.spaces.Discrete(n)
        self.t, self.goal = 0, 0

    def _obs(self) -> dict:
        self.goal = int(self.np_random.integers(self.n))
        return {"goal": self.goal, "noise": self.np_random.uniform(-1, 1, 2).astype(np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = 1.0 if int(action) == self.goal else 0.0
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}


class TargetEnv(gym.Env):
    """Match a target per action component: each step shows a new random target (one-hot
    per component for MultiDiscrete, the bits for MultiBinary) and pays the fraction of
    components the action matched; ``length`` steps (truncated). Random play scores about
    ``length * mean(1 / nvec)``, the right policy ``length``."""

    def __init__(self, action_space: gym.Space, length: int = 20):
        self.action_space, self.length = action_space, length
        self.nvec = (np.asarray(action_space.nvec) if isinstance(action_space, gym.spaces.MultiDiscrete)
                     else None)
        width = int(self.nvec.sum()) if self.nvec is not None else int(action_space.n)
        self.observation_space = gym.spaces.Box(0, 1, (width,), np.float32)
        self.t = 0
        self.target = np.zeros(len(self.nvec) if self.nvec is not None else width, np.int64)

    def _obs(self) -> np.ndarray:
        if self.nvec is None:
            self.target = self.np_random.integers(0, 2, self.target.shape)
            return self.target.astype(np.float32)
        self.target = self.np_random.integers(0, self.nvec)
        obs = np.zeros(self.observation_space.shape, np.float32)
        obs[np.cumsum(self.nvec) - self.nvec + self.target] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if not self.action_space.contains(np.asarray(action, self.action_space.dtype)):
            raise ValueError(f"action {action!r} is outside {self.action_space}")
        reward = float(np.mean(np.asarray(action) == self.target))
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}


def multi_discrete_env(nvec=(3, 2, 4), length: int = 20) -> TargetEnv:
    """``TargetEnv`` with MultiDiscrete(nvec) actions (unequal sizes by default)."""
    return TargetEnv(gym.spaces.MultiDiscrete(list(nvec)), length)


def multi_binary_env(n: int = 4, length: int = 20) -> TargetEnv:
    """``TargetEnv`` with MultiBinary(n) actions."""
    return TargetEnv(gym.spaces.MultiBinary(n), length)


_steps_in_process = 0  # steps taken by every FaultyEnv in this process
_fired_in_process: set = set()  # faults fired, when there is no Ray to remember them


class FaultLog:
    """Remembers which faults fired. As a detached named Ray actor it outlives the samplers it
    counts for, so a restarted sampler does not fire the same fault again."""

    def __init__(self) -> None:
        self.fired: list = []

    def fire(self, key: tuple) -> bool:
        """True the first time ``key`` is asked for (the fault should fire), then False."""
        if key in self.fired:
            return False
        self.fired.append(key)
        return True

    def count(self) -> int:
        return len(self.fired)


def fault_log():
    """The run's FaultLog actor (created on first use), or None outside Ray."""
    import ray

    if not ray.is_initialized():
        return None
    return ray.remote(FaultLog).options(name="walle/faults", lifetime="detached",
                                        get_if_exists=True, num_cpus=0).remote()


def _sampler_indices() -> tuple[int, ...] | None:
    """The samplers this process runs, from its Ray actor name: ``walle/sampler-3``, or
    ``walle/sampler-0,2`` for a packed process."""
    import ray

    if not ray.is_initialized():
        return None
    name = ray.get_runtime_context().get_actor_name() or ""
    if not name.startswith("walle/sampler-"):
        return None
    return tuple(int(i) for i in name.rsplit("-", 1)[1].split(","))


def hang_forever() -> None:
    """Never returns: an env step or a forward pass that hangs, for the stall tests."""
    while True:
        time.sleep(1.0)


def fire_once(key: tuple) -> bool:
    """True the first time in a run that fault ``key`` is asked for (``FaultLog``)."""
    return FaultyEnv._first_time(key)


class FaultyEnv(gym.Wrapper):
    """``base_id`` (CartPole by default) that fails at chosen steps of chosen samplers, for
    fault-tolerance tests: ``faults=[[sampler, step], ...]`` counts the steps of all envs of
    that sampler's process; ``how`` is ``raise`` (an exception from ``step``), ``exit``
    (the process ends at once, like a crash) or ``hang`` (``step`` never returns). Each
    fault fires once per run."""

    def __init__(self, base_id: str = "CartPole-v1", faults=(), how: str = "raise", **kwargs):
        if how not in ("raise", "exit", "hang"):
            raise ValueError(f"FaultyEnv: how={how!r}; use raise, exit or hang")
        super().__init__(gym.make(base_id, **kwargs))
        self.faults = {(int(i), int(step)) for i, step in faults}
        self.how = how
        self.indices = _sampler_indices()  # built inside its sampler's process
        if self.faults and self.indices is not None:  # a sampler's: the log's process starts
            # now, not inside the step that fails, where its start-up would count against the
            # stall watch's run.stall_s
            fault_log()

    def step(self, action):
        global _steps_in_process
        _steps_in_process += 1
        key = next(((i, step) for i, step in self.faults if step == _steps_in_process
                    and (self.indices is None or i in self.indices)), None)
        if key is not None:
            if self._first_time(key):
                if self.how == "exit":
                    os._exit(17)
                if self.how == "hang":
                    hang_forever()
                raise RuntimeError(f"injected fault at step {key[1]} of sampler {key[0]}")
        return self.env.step(action)

    @staticmethod
    def _first_time(key: tuple) -> bool:
        log = fault_log()
        if log is None:
            if key in _fired_in_process:
                return False
            _fired_in_process.add(key)
            return True
        import ray

        with PULSE.waiting("the fault log"):  # another process: not this role's stall
            return ray.get(log.fire.remote(key))


def register_test_envs() -> None:
    for env_id, entry in (("walle/Counting-v0", CountingEnv), ("walle/Sleep-v0", SleepEnv),
                          ("walle/Recall-v0", RecallEnv),
                          ("walle/CartPoleNoVelocity-v0", cartpole_no_velocity),
                          ("walle/Faulty-v0", FaultyEnv), ("walle/Frames-v0", FramesEnv),
                          ("walle/Continuous-v0", ContinuousEnv), ("walle/DictObs-v0", DictObsEnv),
                          ("walle/MultiDiscrete-v0", multi_discrete_env),
                          ("walle/MultiBinary-v0", multi_binary_env),
                          # named, so that a dataset recorded on them stores their spec
                          ("walle/Othello-v0", "walle_ray.envs.games:OthelloEnv"),
                          ("walle/RandomMask-v0", "walle_ray.envs.games:RandomMaskEnv")):
        if env_id not in gym.envs.registry:
            gym.register(env_id, entry_point=entry, disable_env_checker=True)
