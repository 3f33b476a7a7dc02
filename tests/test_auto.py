"""topology=auto: the throughput model's choices (``autoplan``), a run that calibrates,
chooses, reports predicted beside measured and reuses its calibration, what the report
command says auto would choose for any run, and re-planning when a cluster's CPUs change."""

from __future__ import annotations

import json
from dataclasses import replace
import os
import subprocess
import sys

import pytest

from walle_ray.autoplan import Costs, Plan, choose, costs_from_report, predict

from conftest import ROOT, make_cfg, run_cli


def async_costs(**kw) -> Costs:
    base = dict(loop="async", envs_per_sampler=8, env_s=1e-3, act_s=0.0,
                update_s={1: 0.2, 2: 0.12}, steps_per_update=80, memory_s=1e-5,
                learner_counts=(1, 2, 4))
    return Costs(**{**base, **kw})


def sync_costs(**kw) -> Costs:
    base = dict(loop="sync", envs_per_sampler=4, env_s=2e-5, act_s=4e-4,
                update_s={1: 0.07, 2: 0.05}, steps_per_update=1024, total_envs=8,
                learner_counts=(1, 2, 4, 8))
    return Costs(**{**base, **kw})


def test_a_learner_bound_job_gets_threads_and_few_samplers_a_sampler_bound_one_samplers():
    slow_learner = choose(async_costs(env_s=1e-4, update_s={1: 1.0, 2: 0.55}), [4.0])
    assert slow_learner.threads >= 2 and slow_learner.samplers <= 2
    # the learner's threads use the CPUs the samplers would: it is bound by both
    assert slow_learner.bound in ("learner-bound", "CPU-bound")
    slow_env = choose(async_costs(env_s=5e-3, update_s={1: 0.01, 2: 0.008}), [4.0])
    assert slow_env.samplers >= 4 and slow_env.threads == 1
    # The predicted rate is the least of what each part allows.
    assert slow_env.rate == pytest.approx(min(slow_env.limits.values()))


def test_more_cpus_get_more_samplers_and_several_nodes_may_split_the_learner():
    costs = async_costs(env_s=5e-3, update_s={1: 0.01, 2: 0.008})
    small, big = choose(costs, [2.0]), choose(costs, [2.0, 4.0])
    assert big.samplers > small.samplers and big.rate > small.rate
    one_node = choose(async_costs(update_s={1: 2.0}), [4.0])
    assert one_node.learners == 1  # a node's threads before a second process
    nodes = choose(async_costs(update_s={1: 2.0}), [1.0, 1.0, 1.0, 1.0])
    assert nodes.learners > 1 and nodes.memories % nodes.learners == 0


def test_a_synchronous_job_keeps_its_envs_and_gives_each_learner_samplers():
    costs = sync_costs()
    for cpus in ([1.0], [2.0], [8.0], [2.0, 2.0]):
        plan = choose(costs, cpus)
        assert plan.samplers * plan.envs_per_sampler == 8, plan
        assert plan.samplers % plan.learners == 0 and plan.memories == plan.learners
    # An act whose fixed cost dominates keeps envs together; cheap acts spread them.
    assert choose(sync_costs(act_s=1e-2, env_s=1e-6), [8.0]).samplers <= 2
    assert choose(sync_costs(act_s=0.0, env_s=1e-3), [8.0]).samplers == 8


def test_threads_beyond_those_measured_follow_amdahls_law():
    costs = async_costs(update_s={1: 1.0, 2: 0.6})  # 80% of the update runs in parallel
    assert costs.update(4) == pytest.approx(1.0 * (0.2 + 0.8 / 4))
    assert async_costs(update_s={1: 1.0, 2: 1.1}).update(8) == 1.0  # no gain: the best measured


def test_a_replan_keeps_memories_and_learners():
    costs = async_costs(env_s=5e-3, update_s={1: 0.01, 2: 0.008})
    first = choose(costs, [1.0, 1.0])
    kept = choose(costs, [1.0, 1.0, 4.0], keep=first)
    assert (kept.memories, kept.learners) == (first.memories, first.learners)
    assert kept.samplers > first.samplers


def test_samplers_that_deal_an_iterations_work_may_be_as_many_as_it_has_pieces():
    """ES deals algo.pairs among its samplers whatever their envs: auto holds the envs per
    sampler and the pairs, and may run any sampler count that divides the pairs; PPO holds
    its total envs (its batch is the fragment length over them)."""
    es = sync_costs(envs_per_sampler=4, total_envs=8, split_work=32, learner_counts=(1,),
                    env_s=2e-3, act_s=1e-4, update_s={1: 0.01})
    plan = choose(es, [32.0])
    assert plan.samplers > 8 and 32 % plan.samplers == 0 and plan.envs_per_sampler == 4
    # Past an episode per env (64 episodes over 16 samplers of 4 envs), more samplers would
    # only step idle envs: none are planned.
    assert 2 * 32 // plan.samplers >= 4
    wide = choose(replace(es, envs_per_sampler=8), [32.0])
    assert wide.samplers == 8
    ppo = choose(replace(es, split_work=0), [32.0])
    assert ppo.samplers * ppo.envs_per_sampler == 8
    assert "envs per sampler held" in plan.line(es)


def test_a_resumed_synchronous_run_keeps_its_checkpoints_total_envs():
    from walle_ray.runtime.auto import resuming

    # A run of env.envs_per_sampler=4 that its plan gave 4 samplers of 2 envs: 8 envs held.
    costs, keep = resuming(sync_costs(envs_per_sampler=4, total_envs=8), "4a1m1l", 2)
    assert costs.total_envs == 8 and (keep.samplers, keep.memories, keep.learners) == (4, 1, 1)
    # A fixed topology's run, resumed with topology=auto: its 4 samplers of 4 envs.
    costs, keep = resuming(sync_costs(envs_per_sampler=4, total_envs=8), "4a1m1l", 4)
    assert costs.total_envs == 16
    plan = choose(costs, [8.0], keep=keep)
    assert plan.samplers * plan.envs_per_sampler == 16
    es = sync_costs(envs_per_sampler=4, total_envs=8, split_work=32)
    assert resuming(es, "4a1m1l", 4)[0] == es  # its envs per sampler are what it holds
    assert resuming(async_costs(), "4a2m1l", 8)[0] == async_costs()


def test_costs_round_trip_through_json():
    costs = async_costs(update_cpu_s={1: 0.2, 2: 0.3})
    again = Costs.from_json(json.loads(json.dumps(costs.to_json())))
    assert again == costs
    es = sync_costs(split_work=32)
    assert Costs.from_json(json.loads(json.dumps(es.to_json()))) == es
    plan = predict(costs, Plan(2, 1, 1, 1, 8), [2.0])
    assert plan.spec == "2a1m1l" and plan.rate > 0


@pytest.mark.parametrize("costs", [async_costs(), async_costs(env_s=1e-4, update_s={1: 1.0, 2: 0.55}),
                                   async_costs(env_s=5e-3, update_s={1: 0.01}),
                                   async_costs(free_running=True, steps_per_update=0.0),
                                   sync_costs(), sync_costs(act_s=0.0, env_s=1e-3),
                                   sync_costs(split_work=24, learner_counts=(1,))])
def test_every_plan_chosen_is_one_the_resource_plan_accepts(costs):
    """What auto chooses starts: its CPU shares fit (``plan_resources``), no working process
    gets less than a waiting one (``check_shares``), and the plan says what it was made of."""
    from walle_ray.topology import check_shares, parse_topology, plan_resources

    for cpus in ([1.0], [2.0], [4.0], [1.0, 2.0], [2.0, 2.0, 4.0], [16.0]):
        plan = choose(costs, cpus)
        topo = parse_topology(plan.spec)
        processes = topo if costs.loop == "async" else parse_topology(
            f"{plan.samplers}a{plan.memories}m{plan.learners}l")
        shares = plan_resources(processes, sum(cpus))
        check_shares(shares, topo, processes, "fewer")
        assert plan.threads <= max(cpus) and plan.rate > 0 and plan.bound
        if costs.free_running:
            assert "learner-bound" not in plan.limits


def test_a_damaged_or_foreign_cache_is_not_taken_for_costs():
    good = async_costs().to_json()
    assert Costs.from_json(good) == async_costs()
    for bad in ({**good, "steps_per_update": 0}, {**good, "update_s": {}},
                {**good, "env_s": "1e-3"}, {**good, "env_s": float("nan")},
                {**good, "loop": "other"}, {**good, "update_s": {"1": -1.0}},
                {**good, "total_envs": 8.5}, {**good, "total_envs": True},
                {**good, "envs_per_sampler": "4"}, {**good, "gpus_per_learner": "0"},
                {**good, "free_running": "no"}, {**good, "env_s": True},
                {k: v for k, v in good.items() if k != "env_s"}):
        with pytest.raises(ValueError, match="not a set of costs"):
            Costs.from_json(bad)


def test_a_calibration_tells_two_cpus_of_one_plain_name_apart():
    from walle_ray.runtime.calibrate import cpu_model

    block = "processor\t: {n}\ncpu family\t: 25\nmodel\t\t: {m}\nmodel name\t: AMD EPYC\n\n"
    zen3, zen4 = (cpu_model(block.format(n=0, m=m) + block.format(n=1, m=9)) for m in (1, 17))
    assert (zen3, zen4) == ("AMD EPYC (cpu family 25, model 1)",
                            "AMD EPYC (cpu family 25, model 17)")
    assert cpu_model("model name\t: Some CPU\n") == "Some CPU"


def test_a_replan_that_cannot_keep_its_memories_fed_gives_them_samplers():
    costs = async_costs(update_s={1: 2.0}, learner_counts=(1, 2, 4))
    wide = choose(costs, [1.0, 1.0, 1.0, 1.0])
    assert wide.learners > 1
    narrow = choose(costs, [1.0], keep=wide)  # one node left: the kept learners stay
    assert (narrow.memories, narrow.learners) == (wide.memories, wide.learners)
    assert narrow.samplers >= narrow.memories and narrow.rate > 0


def test_a_run_with_too_little_measured_says_so():
    assert costs_from_report({"totals": {"samplers": {}, "learners": {}}}, {}) is None


def test_a_runs_report_carries_the_work_its_samplers_deal():
    from walle_ray.algos import algorithm_for
    from walle_ray.bottleneck import build_report, new_totals
    from walle_ray.runtime.times import run_meta
    from walle_ray.topology import parse_topology

    for algo, work in (("es", 24), ("ppo", 0)):
        cfg = make_cfg(f"algo={algo}", "env=cartpole", *(["algo.pairs=24"] if work else []))
        meta, _ = run_meta(cfg, algorithm_for(cfg.algo), parse_topology("2a1m1l"))
        assert build_report(new_totals(), meta)["run"]["split_work"] == work


def test_a_resumed_auto_run_keeps_the_split_its_checkpoint_ran():
    from walle_ray.runtime.checkpoint import CheckpointError
    from walle_ray.runtime.start import resumed_split

    ckpt = {"config": {"topology": {"spec": "4a1m1l"}, "env": {"envs_per_sampler": 2}}}
    assert resumed_split(ckpt, "runs/a") == ("4a1m1l", 2)
    with pytest.raises(CheckpointError, match="does not say its topology and envs per sampler"):
        resumed_split({"config": {"env": {}}}, "runs/b")


def test_the_report_command_plans_an_es_run_as_auto_would():
    """An ES run's report carries its pairs (``run.split_work``): what auto would choose for
    it deals them among samplers rather than holding the run's total envs."""
    report = {"run": {"loop": "sync", "learners": 1, "split_work": 32},
              "samplers": {"count": 2},
              "totals": {"samplers": {"0": {"cpu_s": 10.0, "env_steps": 5000},
                                      "1": {"cpu_s": 10.0, "env_steps": 5000}},
                         "learners": {"updates": 10, "cpu_s": 0.1}}}
    config = {"env": {"envs_per_sampler": 4}}
    es = costs_from_report(report, config)
    assert es.split_work == 32 and choose(es, [32.0]).samplers == 16
    del report["run"]["split_work"]  # a report from before, or a PPO run: 8 envs held
    ppo = costs_from_report(report, config)
    assert ppo.split_work == 0 and choose(ppo, [32.0]).samplers <= 8


def watching(monkeypatch, cpus: list[float], nodes: list[list[float]]):
    """A ``ClusterWatch`` over a sampler-bound job planned for nodes of ``cpus``, looking at
    every call; each look reads the next of ``nodes``."""
    from walle_ray.runtime import auto as auto_module

    costs = async_costs(envs_per_sampler=4, env_s=2e-3, update_s={1: 0.002},
                        steps_per_update=40, learner_counts=(1,))
    run = auto_module.Auto(costs, choose(costs, cpus), cpus, cached=True, calibrate_s=0.0)
    looks = iter(nodes)
    monkeypatch.setattr(auto_module, "node_cpus", lambda: list(next(looks)))
    return run, auto_module.ClusterWatch(run, stopping=lambda: False, every_s=0.0)


def test_a_node_that_joins_gets_roles_once_it_stays_and_only_for_enough_gain(monkeypatch, capsys):
    from walle_ray.runtime.auto import REPLAN_GAIN, Replan

    # Eight CPUs more: a plan far faster, taken at the second look that sees them.
    run, watch = watching(monkeypatch, [8.0], [[8.0, 8.0], [8.0, 8.0]])
    assert watch({}) == {}
    with pytest.raises(Replan, match="would now run"):
        watch({})
    # A node that joins and leaves before the next look rebuilds nothing.
    run, watch = watching(monkeypatch, [8.0], [[8.0, 8.0], [8.0], [8.0]])
    assert watch({}) == {} and watch({}) == {} and watch({}) == {}
    assert run.cpus == [8.0]
    # One CPU more: another plan, predicted faster by less than a rebuild must gain.
    run, watch = watching(monkeypatch, [8.0], [[8.0, 1.0]] * 3)
    small = choose(run.costs, [8.0, 1.0], keep=run.plan)
    assert small.spec != run.plan.spec
    assert small.rate < predict(run.costs, run.plan, [8.0, 1.0]).rate * (1 + REPLAN_GAIN)
    kept = run.plan
    assert watch({}) == {} and watch({}) == {}
    assert run.plan == kept and run.cpus == [1.0, 8.0]
    assert capsys.readouterr().out.count(f"topology=auto keeps {kept.spec}") == 1
    assert watch({}) == {}  # said once; the cluster is as last seen
    # A rebuild after a lost role re-plans for the CPUs then, so a look from before it
    # does not count as the first of two.
    run, watch = watching(monkeypatch, [8.0], [[8.0, 8.0], [8.0, 8.0], [8.0, 8.0]])
    assert watch({}) == {}
    run.cpus = [8.0, 2.0]  # what replan() sets when it rebuilds
    assert watch({}) == {}
    with pytest.raises(Replan):
        watch({})


def test_a_rebuild_betters_a_plan_kept_for_too_little_gain(monkeypatch):
    from walle_ray.runtime.auto import replan

    run, watch = watching(monkeypatch, [8.0], [[8.0, 1.0]] * 3)
    kept = run.plan
    assert watch({}) == {} and watch({}) == {} and run.plan == kept  # kept: +5%
    cfg = make_cfg("algo=impala", "env=cartpole")
    assert replan(cfg, run)  # a role died: the roles rebuild, on the better plan
    assert run.plan.spec != kept.spec and cfg.topology.spec == run.plan.spec
    # A plan not kept for its gain stays as it is when a role dies on the same CPUs.
    run, watch = watching(monkeypatch, [8.0], [[8.0]])
    assert not replan(cfg, run) and run.replans == 0


def test_a_smaller_biggest_node_is_planned_for_at_the_first_look(monkeypatch):
    from walle_ray.runtime.auto import Replan

    run, watch = watching(monkeypatch, [16.0], [[4.0, 4.0, 4.0, 4.0]])
    run.plan = replace(run.plan, threads=8)  # a learner planned for the 16-CPU node's threads
    with pytest.raises(Replan):
        watch({})


def test_a_node_lost_is_planned_for_at_the_first_look(monkeypatch):
    from walle_ray.runtime.auto import Replan

    run, watch = watching(monkeypatch, [8.0, 8.0], [[8.0]])
    with pytest.raises(Replan, match="from 16 to 8"):
        watch({})


def calibrated(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("walle_ray: auto: "))


def test_topology_auto_calibrates_chooses_reports_and_reuses_its_calibration(tmp_path):
    """A real run: the choice is printed with its prediction, written into the run's config,
    and report.json holds the model's inputs, the choice and the measured rate; the second
    run reads the calibration from the cache; the report command says what auto would choose
    for a run given its topology by hand."""
    env = {"WALLE_CACHE_DIR": str(tmp_path / "cache")}
    args = ["algo=impala", "env=cartpole", "topology=auto", "topology.auto_calibrate_s=4",
            "run.total_env_steps=40000", "run.stop_at_return=null", "run.report_every_s=1"]
    first = run_cli(*args, f"hydra.run.dir={tmp_path / 'a'}", env=env).stdout
    line = calibrated(first)
    assert "calibrated in" in line and "predicted" in line and "held fixed" in line
    assert "envs per sampler" in line and "agent steps/s" in line
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    auto = report["auto"]
    spec = auto["plan"]["spec"]
    assert f"auto: {spec}," in line
    assert auto["costs"]["steps_per_update"] > 0 and auto["costs"]["update_s"]
    assert auto["plan"]["rate"] > 0 and auto["measured_rate"] > 0
    assert auto["calibrate_s"] <= 4 * 3 + 10  # the budget, with the builds around it
    assert f"topology=auto chose {spec}" in report["summary"] and "measured" in report["summary"]
    import yaml

    config = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())
    assert config["topology"]["spec"] == spec and config["topology"]["pack"] == "off"
    assert list((tmp_path / "cache" / "auto").glob("*.json"))

    second = run_cli(*args[:-3], "run.total_env_steps=3000", f"hydra.run.dir={tmp_path / 'b'}",
                     env=env).stdout
    assert "costs from the cache" in calibrated(second)
    assert json.loads((tmp_path / "b" / "report.json").read_text())["auto"]["cached"]
    # A resumed auto run chooses again, with its checkpoint's memories and learners.
    again = run_cli(f"run.resume={tmp_path / 'a'}", "run.total_env_steps=44000", env=env).stdout
    assert "costs from the cache" in calibrated(again) and "resumed at" in again
    kept = yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())["topology"]["spec"]
    assert kept.split("a", 1)[1] == spec.split("a", 1)[1]  # the same memories and learners
    said = subprocess.run([sys.executable, "-m", "walle_ray.report", str(tmp_path / "a")],
                          capture_output=True, text=True, check=True).stdout
    assert "topology=auto would choose" in said and "predicted" in said


def test_topology_auto_refuses_what_it_cannot_plan(tmp_path):
    out = run_cli("algo=bc", "env=cartpole", "topology=auto", "dataset.path=nowhere",
                  f"hydra.run.dir={tmp_path / 'bc'}", check=False)
    assert out.returncode != 0 and "topology=auto plans samplers" in out.stderr + out.stdout
    out = run_cli("topology=auto", "learner.num_gpus=1", f"hydra.run.dir={tmp_path / 'gpu'}",
                  check=False)
    assert out.returncode != 0 and "with learner.num_gpus give a topology" in out.stderr + out.stdout
    out = run_cli("topology=auto", "topology.auto_calibrate_s=0", check=False)
    assert out.returncode != 0 and "topology.auto_calibrate_s" in out.stderr + out.stdout
    # Before Ray starts: CPU shares and custom resources are the plan's to decide.
    from walle_ray.algos import algorithm_for
    from walle_ray.config import ConfigError
    from walle_ray.runtime.auto import plan_auto

    for setting, says in (("topology.sampler_cpus=0.5", "fits the CPU shares itself"),
                          ("topology.resources={learner: {trainer: 1}}",
                           "cannot tell which nodes your resources confine roles to")):
        cfg = make_cfg("algo=impala", "env=cartpole", "topology=auto", setting)
        with pytest.raises(ConfigError, match=says):
            plan_auto(cfg, algorithm_for(cfg.algo), None, None, "nowhere")


pytest.importorskip("ray.cluster_utils")


def test_auto_replans_when_a_node_joins_and_when_it_is_lost(tmp_path):
    """On a simulated cluster, with costs that make the job sampler-bound (written into the
    cache as a calibration would): a node that joins gets samplers, and when it is lost the
    plan shrinks back; the run goes on learning throughout. The nodes are raylets on this
    machine, whose CPUs auto counts once."""
    from ray.cluster_utils import Cluster

    from test_multinode import (FAST_HEALTH, Output, interrupted_at_the_end, records,
                                wait_for)
    from walle_ray.runtime.auto import REPLAN_GAIN
    from walle_ray.runtime.calibrate import cache_key

    cache = tmp_path / "cache"
    cfg = make_cfg("algo=impala", "env=cartpole")
    cfg.env.action_mask = "none"  # as the run decides before it calibrates (start.py)
    key, what = cache_key(cfg, [1])
    costs = async_costs(envs_per_sampler=4, env_s=2e-3, update_s={1: 0.002},
                        steps_per_update=40, learner_counts=(1,))
    (cache / "auto").mkdir(parents=True)
    (cache / "auto" / f"{key}.json").write_text(json.dumps({"made_from": what,
                                                           "costs": costs.to_json()}))
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 0, "_system_config": FAST_HEALTH})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        run_dir = tmp_path / "run"
        proc = subprocess.Popen(
            [sys.executable, "-m", "walle_ray", "algo=impala", "env=cartpole", "topology=auto",
             f"run.ray_address={cluster.address}", "run.total_env_steps=100000000",
             "run.stop_at_return=null", "run.max_wall_s=600", "run.checkpoint_every=5",
             "run.report_every_s=1", "logger.progress=line", f"hydra.run.dir={run_dir}"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "WALLE_CACHE_DIR": str(cache)})
        output = Output(proc)
        with interrupted_at_the_end(proc, output):
            first = choose(costs, [1.0])
            wait_for("the plan", lambda: f"auto: {first.spec}," in output.text, proc, output)
            wait_for("learning", lambda: any(r["updates"] > 0 for r in records(run_dir)),
                     proc, output)
            joined = cluster.add_node(num_cpus=2)
            cluster.wait_for_nodes()
            # Nodes on this machine share its CPUs: theirs are scaled to what it has.
            usable = len(os.sched_getaffinity(0))
            cpus = [c * min(1.0, usable / 3) for c in (1.0, 2.0)]
            grown = choose(costs, cpus, keep=first)
            assert grown.samplers > first.samplers
            # enough of a gain for a rebuild (ClusterWatch)
            assert grown.rate >= predict(costs, first, cpus).rate * (1 + REPLAN_GAIN)
            wait_for("a plan for the new node", lambda: f"now has {sum(cpus):g} CPUs in 2 "
                     f"node(s): auto: {grown.spec}," in output.text, proc, output)
            at = len(records(run_dir))
            wait_for("learning on the new plan", lambda: any(
                r["updates"] > 0 for r in records(run_dir)[at + 2:]), proc, output)
            cluster.remove_node(joined, allow_graceful=False)
            wait_for("a plan for 1 CPU", lambda: f"now has 1 CPUs in 1 node(s): auto: "
                     f"{first.spec}," in output.text, proc, output)
            at = len(records(run_dir))
            wait_for("learning after the node left", lambda: any(
                r["updates"] > 0 for r in records(run_dir)[at + 2:]), proc, output)
        report = json.loads((run_dir / "report.json").read_text())
        assert report["auto"]["replans"] >= 2 and report["auto"]["plan"]["spec"] == first.spec
        assert report["auto"]["cached"]  # the plans came from the costs written above
    finally:
        cluster.shutdown()
