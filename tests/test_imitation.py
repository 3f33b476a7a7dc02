"""Learning from recorded episodes: BC's and MARWIL's losses on hand-computed batches, MARWIL
with beta 0 is BC, the dataset memory's returns and shards, mode=collect writing a Minari
dataset, refused settings, and a collect -> BC round trip on CartPole to 475."""

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from walle_ray.algos.imitation.config import BCConfig, MARWILConfig
from walle_ray.algos.imitation.loss import bc_loss, marwil_loss, marwil_weights
from walle_ray.algos.imitation.update import OfflineUpdate
from walle_ray.batch import OfflineBatch
from walle_ray.buffers.dataset import DatasetMemory, discounted_to_end
from walle_ray.config import ConfigError, ModelConfig
from walle_ray.datasets import DatasetWriter, check_datasets, data_dir, dataset_info
from walle_ray.learners.collective import Collective
from walle_ray.models import make_actor_critic

from conftest import run_cli

CARTPOLE = gym.make("CartPole-v1")


def test_bc_loss_is_the_negative_mean_log_likelihood_less_the_entropy_bonus():
    logp = torch.tensor([-0.5, -1.5, -1.0])
    entropy = torch.tensor([0.6, 0.6, 0.9])
    loss, terms = bc_loss(logp, entropy, ent_coef=0.1)
    assert loss.item() == pytest.approx(1.0 - 0.1 * 0.7)
    assert terms["policy_loss"].item() == pytest.approx(1.0)


def test_marwil_weights_and_loss_by_hand():
    adv = torch.tensor([2.0, -2.0, 0.0, 40.0])
    weight = marwil_weights(adv, beta=0.5, adv_sq=torch.tensor(4.0), max_weight=20.0)
    # exp(0.5 * A / 2): e^0.5, e^-0.5, 1, and e^10 clipped to 20
    np.testing.assert_allclose(weight.numpy(), [math.exp(0.5), math.exp(-0.5), 1.0, 20.0], rtol=1e-5)
    logp = torch.tensor([-1.0, -2.0, -3.0, -0.5])
    v, ret = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([3.0, 0.0, 3.0, 44.0])
    loss, terms = marwil_loss(logp, torch.zeros(4), v, ret, weight, vf_coef=0.5, ent_coef=0.0)
    policy = -(math.exp(0.5) * -1.0 + math.exp(-0.5) * -2.0 + 1.0 * -3.0 + 20.0 * -0.5) / 4
    value = 0.5 * (4.0 + 4.0 + 0.0 + 1600.0) / 4
    assert terms["policy_loss"].item() == pytest.approx(policy, rel=1e-5)
    assert terms["value_loss"].item() == pytest.approx(value, rel=1e-5)
    assert loss.item() == pytest.approx(policy + 0.5 * value, rel=1e-5)


def _model(action_space, seed=0):
    torch.manual_seed(seed)
    return make_actor_critic(CARTPOLE.observation_space, action_space or CARTPOLE.action_space,
                             ModelConfig(hidden=[16, 16]), False)


def _batches(action_space, n=3, rows=32, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        action = (rng.integers(0, 2, rows) if action_space is None
                  else rng.uniform(-1, 1, (rows, 2)).astype(np.float32))
        out.append(OfflineBatch(obs=rng.normal(size=(rows, 4)).astype(np.float32), action=action,
                                ret=rng.normal(size=rows).astype(np.float32) * 10,
                                tail=np.where(rng.random(rows) < 0.3, 0.9, 0.0).astype(np.float32),
                                final_obs=rng.normal(size=(rows, 4)).astype(np.float32)))
    return out


@pytest.mark.parametrize("space", [None, gym.spaces.Box(-1, 1, (2,))], ids=["discrete", "continuous"])
def test_marwil_with_beta_0_is_bc(space):
    """The same updates from the same start, with the default settings (a value loss, the
    gradient clip): with beta 0 MARWIL fits no value and its weights are BC's, the value
    head's untouched."""
    batches = _batches(space)
    runs = {}
    for name, cfg in (("bc", BCConfig()), ("marwil", MARWILConfig(beta=0.0))):
        model = _model(space)
        update = OfflineUpdate(cfg, model, Collective(), False, 10_000, torch.device("cpu"))
        for b in batches:
            metrics = update.update([b], 0)
        runs[name] = {k: v.clone() for k, v in model.state_dict().items()}
    assert "value_loss" not in metrics
    for key, value in runs["bc"].items():
        torch.testing.assert_close(runs["marwil"][key], value)
    untouched = {k: v for k, v in _model(space).state_dict().items() if k.startswith("v.")}
    assert untouched and all(torch.equal(runs["marwil"][k], v) for k, v in untouched.items())


def test_marwil_with_beta_0_is_bc_through_a_shared_conv_torso():
    """Frames: the torso is shared, so a value loss would move the policy too; with beta 0
    it is BC's step, gradient clip and all."""
    frames = gym.spaces.Box(0, 255, (4, 42, 42), np.uint8)
    rng = np.random.default_rng(0)
    batch = OfflineBatch(obs=rng.integers(0, 255, (8, 4, 42, 42), dtype=np.uint8),
                         action=rng.integers(0, 6, 8), ret=rng.normal(size=8).astype(np.float32),
                         tail=np.zeros(8, np.float32), final_obs=np.zeros((8, 4, 42, 42), np.uint8))
    runs = []
    for cfg in (BCConfig(), MARWILConfig(beta=0.0)):
        torch.manual_seed(0)
        model = make_actor_critic(frames, gym.spaces.Discrete(6), ModelConfig(bf16="false"), False)
        update = OfflineUpdate(cfg, model, Collective(), False, 10_000, torch.device("cpu"))
        for _ in range(3):
            update.update([batch], 0)
        runs.append(model.state_dict())
    for key, value in runs[0].items():
        torch.testing.assert_close(runs[1][key], value)


def test_marwil_with_beta_above_0_weights_by_advantage():
    """beta > 0 moves the policy otherwise than BC on the same batches; the value head learns
    the returns, completed with the bootstrap where a row's episode was cut."""
    batches = _batches(None)
    model = _model(None)
    update = OfflineUpdate(MARWILConfig(beta=1.0), model, Collective(), False, 10_000,
                           torch.device("cpu"))
    metrics = update.update(batches[:1], 0)
    assert metrics["weight_max"] > metrics["weight_mean"] > 0
    bc = _model(None)
    OfflineUpdate(BCConfig(), bc, Collective(), False, 10_000, torch.device("cpu")).update(batches[:1], 0)
    assert not torch.equal(model.state_dict()["pi.layers.0.weight"], bc.state_dict()["pi.layers.0.weight"])
    with torch.no_grad():
        ret, _ = update._returns(*(torch.as_tensor(getattr(batches[0], k))
                                   for k in ("ret", "tail", "final_obs")))
        want = batches[0].ret + batches[0].tail * model.value(torch.as_tensor(batches[0].final_obs)).numpy()
    np.testing.assert_allclose(ret.numpy(), want, rtol=1e-5)


def _write(path, episodes, terminal):
    """A CartPole-shaped dataset of episodes of these lengths, rewards 1, 2, 3, ..."""
    writer = DatasetWriter(path, "walle_ray/test/tiny-v0", CARTPOLE.observation_space,
                           CARTPOLE.action_space, None, "test", "test")
    for e, (steps, ends) in enumerate(zip(episodes, terminal)):
        obs = np.full((steps + 1, 4), e, np.float32)
        obs[:, 1] = np.arange(steps + 1)
        writer.add(obs, np.arange(steps) % 2, np.arange(1, steps + 1, dtype=np.float64), ends)
    writer.flush()
    return path


def test_a_dataset_written_to_a_relative_path_lands_there(tmp_path, monkeypatch):
    """``collect.out=datasets/expert``, as the README writes it: Minari would join a relative
    path to itself."""
    monkeypatch.chdir(tmp_path)
    _write(Path("datasets") / "expert", [3], [True])
    memory = DatasetMemory(["datasets/expert"], 0, 1, batch_size=3,
                           gamma=0.5, seed=0)
    assert memory.sample().ret.shape == (3,)


def test_the_dataset_memory_completes_returns_where_a_time_limit_cut_the_episode(tmp_path):
    path = _write(tmp_path / "d", [3, 2], [True, False])
    memory = DatasetMemory([str(path)], 0, 1, batch_size=5, gamma=0.5, seed=0)
    batch = memory.sample()
    order = np.lexsort((batch.obs[:, 1], batch.obs[:, 0]))
    # episode 0 (terminated): 1 + .5*2 + .25*3 = 2.75, 2 + .5*3 = 3.5, 3; no tail
    # episode 1 (cut after 2 steps): 1 + .5*2 = 2, 2; tails .25 and .5 onto its last observation
    np.testing.assert_allclose(batch.ret[order], [2.75, 3.5, 3.0, 2.0, 2.0])
    np.testing.assert_allclose(batch.tail[order], [0, 0, 0, 0.25, 0.5])
    np.testing.assert_allclose(batch.final_obs[order][:, :2], [[0, 3]] * 3 + [[1, 2]] * 2)
    np.testing.assert_allclose(discounted_to_end(np.array([1.0, 1.0]), 1.0), [2.0, 1.0])


def test_recorded_actions_are_the_envs_and_the_memory_gives_the_heads_their_indices():
    from walle_ray.datasets import head_actions
    from walle_ray.runtime.collect import RandomPolicy, env_actions

    shifted = gym.spaces.Discrete(3, start=-1)
    np.testing.assert_array_equal(env_actions(np.array([0, 2]), shifted), [-1, 1])
    np.testing.assert_array_equal(head_actions(np.array([-1, 1]), shifted), [0, 2])
    assert set(RandomPolicy(shifted, 0).act(np.zeros((50, 1))).tolist()) == {0, 1, 2}
    bits = head_actions(np.array([[0, 1]], np.int8), gym.spaces.MultiBinary(2))
    assert bits.dtype == np.float32  # the Bernoulli head's log_prob takes floats
    box = gym.spaces.Box(-1, 1, (2,))
    np.testing.assert_array_equal(env_actions(np.array([[3.0, -0.5]]), box), [[1.0, -0.5]])


def test_a_noisy_expert_takes_a_random_action_with_the_given_probability():
    from walle_ray.runtime.collect import EpsilonMix, RandomPolicy

    class Zero:
        def act(self, obs):
            return np.zeros(len(obs), np.int64)

    space = gym.spaces.Discrete(5)
    obs = np.zeros((4000, 1))
    never = EpsilonMix(Zero(), RandomPolicy(space, 0), 0.0, 0).act(obs)
    half = EpsilonMix(Zero(), RandomPolicy(space, 0), 0.5, 0).act(obs)
    assert not never.any()
    # a random action is 0 one time in 5: 0.5 * 4 / 5 of the actions are not 0
    assert abs((half != 0).mean() - 0.4) < 0.03


def test_dataset_memories_shard_whole_episodes_and_serve_each_step_once_per_epoch(tmp_path):
    path = _write(tmp_path / "d", [4, 3, 5, 2], [True] * 4)
    shards = [DatasetMemory([str(path)], k, 2, batch_size=3, gamma=None, seed=1) for k in range(2)]
    assert [len(m) for m in shards] == [4 + 5, 3 + 2]
    assert set(shards[0].obs[:, 0]) == {0, 2} and set(shards[1].obs[:, 0]) == {1, 3}
    served = np.concatenate([shards[0].sample().obs for _ in range(3)])  # one epoch: 9 rows
    assert sorted(map(tuple, served[:, :2])) == sorted(map(tuple, shards[0].obs[:, :2]))
    assert shards[0].sample().ret is None  # BC: no returns
    assert shards[0].stats()["epochs"] == pytest.approx(12 / 9)


def test_collect_writes_a_minari_dataset_of_whole_episodes(tmp_path):
    out = tmp_path / "random"
    proc = run_cli("mode=collect", "env=cartpole", "collect.random=true", "collect.episodes=7",
                   f"collect.out={out}", "collect.envs=3", f"hydra.run.dir={tmp_path / 'run'}")
    assert "wrote 7 episodes" in proc.stdout
    import minari

    dataset = minari.MinariDataset(str(out / "data"))
    assert dataset.total_episodes == 7
    assert dataset.spec.env_spec.id == "CartPole-v1"
    for episode in dataset.iterate_episodes():
        steps = len(episode.actions)
        assert episode.observations.shape == (steps + 1, 4)
        assert episode.terminations[-1] and not episode.terminations[:-1].any()
    info = dataset_info(str(out))
    assert info.episodes == 7 and info.steps == dataset.total_steps
    # again into the same directory: refused, the first dataset kept
    again = run_cli("mode=collect", "env=cartpole", "collect.random=true", "collect.episodes=1",
                    f"collect.out={out}", f"hydra.run.dir={tmp_path / 'run2'}", check=False)
    assert again.returncode == 2 and "already holds a dataset" in again.stderr
    assert minari.MinariDataset(str(out / "data")).total_episodes == 7


def test_collect_from_python_returns_what_it_wrote(tmp_path):
    import walle_ray

    result = walle_ray.collect(env="cartpole", collect={"random": True, "episodes": 3,
                                                        "out": str(tmp_path / "d")})
    assert result["episodes"] == 3 and result["dataset_id"] == "walle_ray/cartpole/d-v0"
    info = dataset_info(result["path"])
    assert info.episodes == 3 and info.steps == result["steps"] and info.env_id == "CartPole-v1"


def test_a_dataset_made_by_minari_itself_is_found_by_its_id(tmp_path, monkeypatch):
    import warnings

    import minari
    from minari.data_collector.episode_buffer import EpisodeBuffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    episodes = [EpisodeBuffer(observations=np.random.rand(4, 4).astype(np.float32),
                              actions=np.array([0, 1, 0]), rewards=np.ones(3),
                              terminations=np.array([False, False, True]),
                              truncations=np.zeros(3, bool), infos={}) for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari asks for an author, a description and so on
        minari.create_dataset_from_buffers("users/cartpole/mine-v0", episodes, env="CartPole-v1",
                                           algorithm_name="theirs")
    assert data_dir("users/cartpole/mine-v0") == tmp_path / "users" / "cartpole" / "mine-v0" / "data"
    info = check_datasets(["users/cartpole/mine-v0"], CARTPOLE.observation_space,
                          CARTPOLE.action_space, "CartPole-v1", 2)[0]
    assert (info.episodes, info.steps, info.env_id) == (2, 6, "CartPole-v1")
    memory = DatasetMemory(["users/cartpole/mine-v0"], 1, 2, batch_size=3, gamma=0.9, seed=0)
    assert len(memory) == 3 and memory.sample().tail.tolist() == [0, 0, 0]


def test_bad_datasets_and_topologies_get_one_line(tmp_path):
    path = _write(tmp_path / "d", [3, 2], [True, True])
    with pytest.raises(ConfigError, match="no Minari dataset"):
        data_dir(str(tmp_path / "nothing"))
    assert data_dir(str(path)) == data_dir(str(path / "data"))
    pendulum = gym.make("Pendulum-v1")
    with pytest.raises(ConfigError, match="holds observations .* but Pendulum-v1"):
        check_datasets([str(path)], pendulum.observation_space, pendulum.action_space,
                       "Pendulum-v1", 1)
    with pytest.raises(ConfigError, match="2 episodes cannot be shared among 3 memories"):
        check_datasets([str(path)], CARTPOLE.observation_space, CARTPOLE.action_space,
                       "CartPole-v1", 3)
    cases = [
        (["algo=bc", "topology=0a1m1l"], "dataset.path: algo=bc learns from a recorded dataset"),
        (["algo=bc", f"dataset.path={path}"], "has no use for samplers; use 0a1m1l"),
        (["algo=marwil", "topology=0a1m1l", f"dataset.path={tmp_path / 'none'}"], "no Minari dataset"),
        (["algo=ppo", "topology=0a1m1l"], "learns from what samplers collect"),
        (["algo=marwil", "env=pendulum", "topology=0a1m1l", f"dataset.path={path}"],
         "holds observations"),
        (["mode=collect"], "run.checkpoint: mode=collect records a trained policy"),
    ]
    for args, message in cases:
        proc = run_cli(*args, f"hydra.run.dir={tmp_path / 'r'}", check=False, timeout=120)
        assert proc.returncode == 2, (args, proc.stderr[-500:])
        assert message in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr[-500:])


def test_a_dataset_without_its_spaces_makes_no_env_and_is_refused_in_one_line(tmp_path):
    """Minari learns a missing space by making the env its metadata's env_spec names; a
    crafted spec would run its entry point. The metadata is refused before Minari reads it."""
    marker = tmp_path / "ran"
    spec = gym.spec("CartPole-v1").to_json()
    evil = json.dumps({**json.loads(spec), "id": "Evil-v0", "entry_point": "os:system",
                       "kwargs": {"command": f"touch {marker}"}})
    for key in ("observation_space", "action_space"):
        path = _write(tmp_path / key, [3, 2], [True, True])
        metadata = path / "data" / "metadata.json"
        meta = json.loads(metadata.read_text())
        del meta[key]
        metadata.write_text(json.dumps({**meta, "env_spec": evil}))
        with pytest.raises(ConfigError, match=f"has no '{key}'"):
            dataset_info(str(path))
        proc = run_cli("algo=bc", "topology=0a1m1l", f"dataset.path={path}",
                       f"hydra.run.dir={tmp_path / 'r'}", check=False, timeout=120)
        lines = [line for line in proc.stderr.splitlines() if line.startswith("walle_ray: error:")]
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
        assert f"{metadata} has no '{key}'" in lines[0] and "Traceback" not in proc.stderr
        assert not marker.exists()
    meta["observation_space"] = '{"type": "Box", "shape": "nonsense"}'
    metadata.write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="holds a 'observation_space' that is not a space"):
        dataset_info(str(path))


def _write_broken(path, obs_fill, reward_fill):
    """Two CartPole-shaped episodes of 3 steps: the first's observations ``obs_fill``, the
    second's last reward ``reward_fill``."""
    writer = DatasetWriter(path, "walle_ray/test/broken-v0", CARTPOLE.observation_space,
                           CARTPOLE.action_space, None, "test", "test")
    writer.add(np.full((4, 4), obs_fill, np.float32), np.array([0, 1, 0]), np.ones(3), True)
    writer.add(np.zeros((4, 4), np.float32), np.array([1, 0, 1]), np.array([1, 1, reward_fill]),
               True)
    writer.flush()
    return path


def test_a_dataset_with_nan_or_inf_is_refused_in_one_line(tmp_path):
    """All-NaN observations made every loss NaN: each step skipped, and the run ended with
    exit 0 and the policy it started with."""
    spaces = (CARTPOLE.observation_space, CARTPOLE.action_space, "CartPole-v1", 1)
    all_nan = _write_broken(tmp_path / "nan", np.nan, 1.0)
    with pytest.raises(ConfigError, match=r"^dataset\.path: .*nan/data holds NaN or inf "
                                          r"observations in episode 0; clean the dataset"):
        check_datasets([str(all_nan)], *spaces)
    with pytest.raises(ConfigError, match="holds NaN or inf observations in episode 0"):
        DatasetMemory([str(all_nan)], 0, 1, batch_size=2, gamma=None, seed=0)
    late_inf = _write_broken(tmp_path / "inf", 0.0, np.inf)  # its first episode is whole
    check_datasets([str(late_inf)], *spaces)
    with pytest.raises(ConfigError, match="holds NaN or inf rewards in episode 1"):
        DatasetMemory([str(late_inf)], 0, 1, batch_size=2, gamma=0.9, seed=0)
    proc = run_cli("algo=bc", "topology=0a1m1l", f"dataset.path={all_nan}",
                   f"hydra.run.dir={tmp_path / 'run'}", check=False, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "walle_ray: error: dataset.path:" in proc.stderr and "NaN or inf" in proc.stderr


@pytest.mark.parametrize("topology", ["local", "0a2m2l"])
def test_an_offline_run_stops_within_one_update_of_its_budget(tmp_path, topology):
    """Its env steps are the recorded rows learned from: a learner's calls stop where the
    budget does (79 updates of 256 rows, over two calls of at most 50), not at the end of
    a call of 50; two learners are asked alike, as they update in lockstep."""
    import walle_ray

    data = _write(tmp_path / "d", [20, 30, 25], [True, False, True])
    result = walle_ray.train(["algo=bc", "env=cartpole", f"topology={topology}",
                              f"dataset.path={data}", "run.total_env_steps=20000",
                              "eval.every_env_steps=100000", "eval.episodes=1"],
                             run_dir=tmp_path / "run", logger={"progress": "off"})
    assert result.stopped_by == "budget" and result.counters["env_steps"] == 79 * 256


def test_an_offline_run_resumes_where_it_stopped_and_evaluates_as_it_goes(tmp_path):
    data = _write(tmp_path / "d", [20, 30, 25], [True, False, True])
    run = tmp_path / "run"
    common = ["algo=marwil", "env=cartpole", "topology=local", f"dataset.path={data}",
              "eval.every_env_steps=2048", "eval.episodes=2", "run.report_every_s=0.2",
              "algo.updates_per_call=1"]
    first = run_cli(*common, "run.total_env_steps=4096", f"hydra.run.dir={run}").stdout
    assert "stopped (budget) at 4096 env steps; evaluation return" in first
    run_cli(*common, "run.total_env_steps=8192", f"run.resume={run}")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["env_steps"] for r in records]
    assert steps == sorted(steps) and 4096 in steps and steps[-1] == 8192
    evals = [r for r in records if "eval/return" in r]
    assert len(evals) >= 2 and all(r["return"] == r["eval/return"] for r in evals)


@pytest.mark.slow
def test_collect_then_bc_reaches_475_on_cartpole(tmp_path):
    """A PPO expert, 20 greedy episodes of it as a Minari dataset, then BC through Ray with
    no samplers (0a1m1l) until its evaluation episodes average 475."""
    expert = tmp_path / "expert"
    run_cli("algo=ppo", "env=cartpole", "topology=local", "run.stop_at_return=490",
            "run.total_env_steps=200000", f"hydra.run.dir={expert}", timeout=300)
    data = tmp_path / "data"
    out = run_cli("mode=collect", f"run.checkpoint={expert}", "collect.episodes=20",
                  "collect.deterministic=true", f"collect.out={data}",
                  f"hydra.run.dir={tmp_path / 'c'}").stdout
    assert "wrote 20 episodes" in out
    run = tmp_path / "bc"
    out = run_cli("algo=bc", "env=cartpole", "topology=0a1m1l", f"dataset.path={data}",
                  "run.ray_num_cpus=2", "run.total_env_steps=3000000", "eval.every_env_steps=25600",
                  "eval.episodes=5", "run.stop_at_return=475", "run.report_every_s=1",
                  "logger.progress=line", f"hydra.run.dir={run}", timeout=400).stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval/return"] for r in records if "eval/return" in r]
    assert evals and max(evals) >= 475, out[-2000:]
    assert "stopped (return)" in out and (run / "checkpoints" / "last.pt").is_file()
    report = json.loads((run / "report.json").read_text())
    assert report["memories"][0]["served_rows"] > 0 and "sampler" not in report["summary"]


def test_the_advantage_normaliser_follows_the_batches_at_its_rate():
    """c^2 starts at ``adv_norm_init`` (or the first batch's mean A^2) and moves a step of
    ``adv_norm_rate`` towards each batch's: RLlib's settings and walle_ray's defaults."""
    from walle_ray.algos.imitation.update import advance_adv_sq

    assert advance_adv_sq(None, 4.0, 1e-3) == 4.0
    assert advance_adv_sq(4.0, 14.0, 0.5) == 9.0
    batches = _batches(None, n=3)
    for cfg, first in ((MARWILConfig(beta=1.0), None),
                       (MARWILConfig(beta=1.0, adv_norm_init=100.0, adv_norm_rate=1e-8,
                                     max_weight=None), 100.0)):
        model = _model(None)
        update = OfflineUpdate(cfg, model, Collective(), False, 10_000, torch.device("cpu"))
        assert update.adv_sq == first
        want = first
        for b in batches:
            with torch.no_grad():  # the batch's mean A^2 under the model before its step
                ret, _ = update._returns(*(torch.as_tensor(getattr(b, k))
                                           for k in ("ret", "tail", "final_obs")))
                sq = float((ret - model.value(torch.as_tensor(b.obs))).pow(2).mean())
            update.update([b], 0)
            want = advance_adv_sq(want, sq, cfg.adv_norm_rate)
            assert update.adv_sq == pytest.approx(want, rel=1e-5)
    assert update.adv_sq == pytest.approx(100.0, rel=1e-6)  # RLlib's barely moves
    weight = marwil_weights(torch.tensor([1e3]), 1.0, torch.tensor(1.0), None)
    assert weight.item() > 20  # no clip
