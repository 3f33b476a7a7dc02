"""A synchronous learner's torch threads, chosen by timing its first updates both ways."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from walle_ray.runtime.threads import ThreadChoice

from conftest import algorithm_for, make_cfg


def run(choice: ThreadChoice, per_step, first_s: float = 9.0):
    """Feeds ``choice`` updates of 10 gradient steps until it chooses, the first at each
    count taking ``first_s`` and the k-th timed one at ``threads`` ``per_step(threads, k)``
    a step; returns the thread counts it asked for and the line it gave."""
    asked, line = [], None
    while choice.chosen is None:
        threads = choice.next()
        k = asked.count(threads)
        asked.append(threads)
        seconds = first_s if k == 0 else per_step(threads, k - 1) * 10
        line = choice.timed(threads, seconds, 10)
    return asked, line


def test_small_steps_that_threads_slow_down_run_on_one_after_a_round_that_is_clear():
    choice = ThreadChoice(2)
    asked, line = run(choice, lambda t, k: {2: 3.4e-3, 1: 1.6e-3}[t])
    assert asked == [1, 2, 1, 2, 1, 2] and choice.chosen == 1 and choice.next() == 1
    assert line.startswith("walle_ray: learner: 1 torch thread, 1.60 ms a gradient step "
                           "against 3.40 ms with 2")
    assert choice.timed(1, 1.0, 10) is None  # said once


def test_the_first_update_at_each_count_is_not_timed_and_slow_updates_do_not_decide():
    choice = ThreadChoice(4)  # close: every round of the three
    # 4 threads: 2.0 ms a step but for two updates a hundred times slower (another process
    # held a CPU), so that the median would pick one thread; 1 thread: 2.6 ms
    asked, line = run(choice, lambda t, k: 0.2 if t == 4 and k > 0 else {4: 2.0e-3, 1: 2.6e-3}[t],
                      first_s=100.0)
    assert asked == [1, 4, 1, 4, 1, 4, 1, 4] and choice.chosen == 4
    assert choice.per_step[4] == pytest.approx([2.0e-3, 0.2, 0.2])
    assert choice.per_step[1] == pytest.approx([2.6e-3] * 3)
    assert "4 torch threads, 2.00 ms a gradient step against 2.60 ms with 1" in line


def test_nothing_to_choose_with_one_thread_or_an_update_without_gradient_steps():
    choice = ThreadChoice(1)
    assert choice.chosen == 1 and choice.next() == 1 and choice.timed(1, 1.0, 5) is None
    choice = ThreadChoice(2)  # ES's update reports no gradient steps: its threads stay
    assert choice.timed(choice.next(), 1.0, None) is None and choice.chosen == 2


@pytest.mark.parametrize("choose", [False, True])
def test_a_learner_keeps_threads_it_was_given_and_chooses_only_when_asked(monkeypatch, choose):
    """The learner process's wiring: threads it was given (``learner.torch_threads``,
    topology=auto) stay; asked to choose, it times its updates in turns and ends on the
    faster count, here one (a fake clock makes each update take 10 ms a thread)."""
    from test_ppo_update import batch

    from walle_ray.models import make_actor_critic
    from walle_ray.runtime import learner_worker, threads
    from walle_ray.runtime.process import usable_cpus

    monkeypatch.setattr(learner_worker.ray, "get", lambda refs: refs)  # the fragments themselves
    clock = {"now": 0.0}
    monkeypatch.setattr(threads.time, "perf_counter", lambda: clock["now"])
    cfg = make_cfg("algo.minibatch_size=32", "algo.epochs=1")
    obs, act = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), gym.spaces.Discrete(3)
    before = torch.get_num_threads()
    try:
        worker = learner_worker.LearnerWorker(algorithm_for(cfg.algo).learner(cfg, 1), obs, act,
                                              threads=2, choose_threads=choose)
        update = worker.learner.update

        def ten_ms_a_thread(fragments, env_steps):
            clock["now"] += 0.01 * torch.get_num_threads()
            return update(fragments, env_steps)

        worker.learner.update = ten_ms_a_thread
        fragment = batch(make_actor_critic(obs, act, cfg.model))
        seen = [worker.learn([fragment], 0)[0]["torch_threads"] for _ in range(10)]
    finally:
        torch.set_num_threads(before)
    given = min(2, usable_cpus())
    if not choose:
        assert seen == [given] * 10
    elif given == 2:
        assert seen == [1, 2, 1, 2, 1, 2, 1, 1, 1, 1] and worker.threads.chosen == 1
    else:  # one usable CPU: nothing to choose, and nothing timed
        assert seen == [1] * 10 and worker.threads.chosen == 1 and worker.threads.calls == 0


@pytest.mark.parametrize("given", [None, 1])
def test_a_local_run_gives_its_learner_the_processs_cpus_and_times_them(monkeypatch, given):
    """topology=local: every role takes turns in the driver, so its learner runs a thread on
    each CPU of the process and times them against one, update by update (one gradient step
    each) as it drains the memory; ``learner.torch_threads`` fixes them. Here a fake clock
    makes each update take 10 ms a thread, so one thread is faster."""
    from walle_ray.envs import env_spaces
    from walle_ray.runtime import threads
    from walle_ray.runtime.fleet import LocalFleet
    from walle_ray.runtime.process import usable_cpus
    from walle_ray.topology import parse_topology

    clock = {"now": 0.0}
    monkeypatch.setattr(threads.time, "perf_counter", lambda: clock["now"])
    cfg = make_cfg("algo=impala", "env=cartpole", "topology=local", "algo.batch_size=2",
                   "algo.fragment_length=8", "env.envs_per_sampler=2",
                   *([f"learner.torch_threads={given}"] if given else []))
    before = torch.get_num_threads()
    fleet = LocalFleet(cfg, algorithm_for(cfg.algo), parse_topology("local"), *env_spaces(cfg.env))
    try:
        update = fleet.learner.update

        def ten_ms_a_thread(batches, env_steps):
            clock["now"] += 0.01 * torch.get_num_threads()
            return update(batches, env_steps)

        fleet.learner.update = ten_ms_a_thread
        fleet.start()
        seen = []
        while len(seen) < 10:
            seen += [m["torch_threads"] for m in fleet.step(0).learned]
    finally:
        fleet.shutdown()
        torch.set_num_threads(before)
    cpus = usable_cpus()
    if given or cpus == 1:
        assert seen[:10] == [1] * 10 and fleet.threads.calls == 0
    else:
        assert seen[:10] == [1, cpus, 1, cpus, 1, cpus, 1, 1, 1, 1] and fleet.threads.chosen == 1
