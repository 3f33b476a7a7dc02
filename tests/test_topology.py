"""Topology strings, the resource plan, and their error messages."""

import functools

import pytest

from walle_ray.config import ConfigError
from walle_ray.topology import Topology, check_samplers, parse_topology, plan_resources


@pytest.mark.parametrize("spec,counts", [
    ("32a4m4l", (32, 4, 4, 1)), ("4a8m1l", (4, 8, 1, 1)), ("12a3m2l", (12, 3, 2, 1)),
    ("8a2m2l0p", (8, 2, 2, 0)), ("1a1m1l1p", (1, 1, 1, 1)), (" 4A1M1L ", (4, 1, 1, 1)),
])
def test_valid_strings(spec, counts):
    t = parse_topology(spec)
    assert (t.samplers, t.memories, t.learners, t.param_servers) == counts
    assert not t.local


def test_local_runs_one_of_each_in_process():
    t = parse_topology("local")
    assert t.local and (t.samplers, t.memories, t.learners) == (1, 1, 1)


@pytest.mark.parametrize("spec,fragment", [
    ("4a1m", "malformed"), ("a1m1l", "malformed"), ("4x1m1l", "malformed"), ("", "malformed"),
    ("4a0m1l", "at least one"), ("4a1m0l", "at least one"), ("4a1m1l2p", "0 or 1"),
    ("4a1m2l", "M >= L"), ("-1a1m1l", "malformed"),
])
def test_invalid_strings_show_the_grammar(spec, fragment):
    with pytest.raises(ConfigError) as err:
        parse_topology(spec)
    assert fragment in str(err.value)
    assert "<A>a<M>m<L>l[<P>p]" in str(err.value) or "M >= L" in str(err.value)


def test_no_samplers_only_for_an_algorithm_that_reads_a_dataset():
    t = parse_topology("0a1m1l")
    assert t.samplers == 0 and plan_resources(t, cluster_cpus=2).learner_cpus > 0
    check_samplers(t, "bc", reads_dataset=True)
    with pytest.raises(ConfigError, match=r"algo=ppo learns from what samplers collect.*1a1m1l"):
        check_samplers(t, "ppo", reads_dataset=False)


def test_memories_split_evenly_between_learners():
    t = parse_topology("12a3m2l")
    assert t.memories_of_learner(0) == [0, 2] and t.memories_of_learner(1) == [1]
    assert [t.memory_of_sampler(i) for i in range(4)] == [0, 1, 2, 0]


@pytest.mark.parametrize("spec", ["32a4m4l", "16a2m2l", "4a8m1l", "2a1m1l", "64a8m8l"])
def test_any_topology_fits_two_cpus(spec):
    t = parse_topology(spec)
    plan = plan_resources(t, cluster_cpus=2)
    assert plan.total_cpus(t) <= 2.0 + 1e-9
    assert plan.sampler_cpus > 0 and plan.learner_cpus > 0


def test_gpus_per_learner_are_carried_into_the_plan():
    plan = plan_resources(parse_topology("8a2m2l"), cluster_cpus=16, learner_gpus=1)
    assert plan.learner_gpus == 1 and plan.learner_cpus == 1.0


def test_shares_that_cannot_fit_are_refused():
    with pytest.raises(ConfigError, match="does not fit"):
        plan_resources(parse_topology("4a1m1l"), cluster_cpus=2, learner_cpus=2.5)


def test_samplers_are_pinned_only_with_a_cpu_for_each():
    """``topology.pin_samplers`` pins when the cluster has a CPU per sampler, never past that."""
    from conftest import make_cfg

    from walle_ray.runtime.role_setup import pins_samplers

    assert pins_samplers(make_cfg("topology=2a1m1l"), 2, 2.0)
    assert not pins_samplers(make_cfg("topology=4a1m1l"), 4, 2.0)
    assert pins_samplers(make_cfg("topology=4a1m1l"), 4, 16.0)
    off = make_cfg("topology=2a1m1l", "topology.pin_samplers=false")
    assert not pins_samplers(off, 2, 2.0)


def test_logical_roles_pack_into_the_processes_the_cluster_has_cpus_for():
    from walle_ray.topology import plan_packing

    t = parse_topology("32a4m4l")
    two = plan_packing(t, 2)
    assert two.samplers == (tuple(range(0, 32, 2)), tuple(range(1, 32, 2)))
    assert two.memories == ((0, 1, 2, 3),) and two.learners == ((0, 1, 2, 3),)
    # packed, learner process 0 keeps the parameter server's weights: one process fewer
    assert two.packed and two.ps_in_learner and two.processes(t) == parse_topology("2a1m1l0p")
    assert two.describe(t) == ("32 samplers in 2 processes (16 each), 4 memories in 1 process "
                               "(4 each), 4 learners in 1 process (4 each), the parameter "
                               "server in learner process 0")
    # not where it runs unpacked, for GPU learners, where the user places it, or with none
    assert not plan_packing(t, 64).ps_in_learner and not plan_packing(t, 2, "off").ps_in_learner
    assert not plan_packing(t, 2, learner_gpus=1).ps_in_learner
    assert not plan_packing(t, 2, packs_ps=False).ps_in_learner
    none = parse_topology("32a4m4l0p")
    assert plan_packing(none, 2).processes(none).param_servers == 0
    eight = plan_packing(t, 8)
    assert len(eight.samplers) == 8 and eight.learners == ((0, 2), (1, 3))  # equal shards each
    assert eight.memories == ((0,), (1,), (2,), (3,))  # a memory process per 2 sampler processes
    # a CPU for each sampler and learner, or pack=off: one process per role
    assert not plan_packing(t, 64).packed and not plan_packing(t, 2, "off").packed
    assert len(plan_packing(t, 2, 4).samplers) == 4  # a number of sampler processes
    # GPU learners and learners whose algorithm cannot pack them keep a process each
    assert plan_packing(t, 2, learner_gpus=1).learners == ((0,), (1,), (2,), (3,))
    assert plan_packing(t, 2, packs_learners=False).learners == ((0,), (1,), (2,), (3,))
    assert plan_packing(parse_topology("2a1m1l"), 2).describe(parse_topology("2a1m1l")) == (
        "2 samplers in 2 processes, 1 memory in 1 process, 1 learner in 1 process, "
        "the parameter server in learner process 0")
    assert plan_packing(parse_topology("2a1m1l"), 3).describe(parse_topology("2a1m1l"),
                                                              memories=False) == (
        "2 samplers in 2 processes, 1 learner in 1 process")
    assert plan_packing(parse_topology("0a1m1l"), 2).samplers == ()


def test_a_process_of_many_samplers_steps_them_together_and_deals_their_rows():
    """Two or more logical samplers in a process step together: one sampler's envs, a
    multiple of the memories. Their rows are dealt across every
    memory in equal shares, in pieces no bigger than the memories are sized for, each row
    once, on every process of a packing however uneven."""
    from walle_ray.topology import lane_envs, lane_routes, piece_rows, plan_packing

    assert [piece_rows(8, m) for m in (1, 2, 3, 4, 8, 16)] == [8, 4, 3, 2, 1, 1]
    assert lane_envs(1, 8, 4) is None  # a process of one sampler steps its own envs
    assert [lane_envs(k, 8, 4) for k in (2, 3, 4, 8, 16, 17, 64)] == [8] * 7
    assert lane_envs(3, 4, 2) == 4 and lane_envs(7, 1, 3) == 3 and lane_envs(5, 6, 4) == 8
    t = parse_topology("32a4m4l")
    routes = lane_routes(t, 1, 8, 2)  # process 1 of 2: samplers 1, 3, ..., 31
    assert routes == [(1, [0, 4]), (2, [1, 5]), (3, [2, 6]), (0, [3, 7])]
    for spec, envs, cpus in (("32a4m4l", 8, 2), ("32a4m4l", 8, 3), ("32a4m4l", 8, 5),
                             ("12a4m4l", 4, 2), ("6a4m4l", 8, 2), ("16a2m2l", 8, 2),
                             ("8a1m1l", 8, 2), ("4a1m1l", 8, 2), ("9a3m1l", 1, 2)):
        topo = parse_topology(spec)
        piece = piece_rows(envs, topo.memories)
        for group in plan_packing(topo, cpus).samplers:
            rows = lane_envs(len(group), envs, topo.memories)
            routes = lane_routes(topo, group[0], rows, piece)
            assert sorted(r for _, part in routes for r in part) == list(range(rows))
            assert max(len(part) for _, part in routes) <= piece
            shares = [sum(len(part) for k, part in routes if k == m) for m in range(topo.memories)]
            assert shares == [rows // topo.memories] * topo.memories, (spec, cpus, group, shares)


def test_only_impala_steps_a_process_of_samplers_together():
    """PPO's batch is its samplers' envs times the fragment and Ape-X's samplers each explore
    with their own epsilon: theirs keep their envs, as do IMPALA's with topology.lanes=false."""
    from conftest import make_cfg
    from walle_ray.algos import algorithm_for
    from walle_ray.runtime.role_setup import process_lanes

    group = tuple(range(0, 32, 2))
    for overrides, rows in ((["algo=impala", "env=pong"], 8),
                            (["algo=impala", "env=pong", "topology.lanes=false"], None),
                            (["algo=ppo"], None), (["algo=apex"], None)):
        cfg = make_cfg(*overrides, "topology=32a4m4l")
        topo = parse_topology(cfg.topology.spec)
        assert process_lanes(cfg, algorithm_for(cfg.algo), topo, group) == rows, overrides
    cfg = make_cfg("algo=impala", "env=pong", "topology=32a4m4l")
    assert process_lanes(cfg, algorithm_for(cfg.algo), parse_topology("32a4m4l"), (0, 2)) == 8
    assert process_lanes(cfg, algorithm_for(cfg.algo), parse_topology("32a4m4l"), (5,)) is None


@pytest.mark.parametrize("spec", ["4a1m1l", "8a1m1l", "32a1m1l"])
def test_on_two_cpus_a_topology_of_one_memory_builds_the_samplers_of_2a1m1l(spec):
    """On 2 CPUs, 4, 8 or 32 IMPALA samplers step together in 2 processes, which run the
    samplers of 2a1m1l's: the same sampler class, index, seed, envs and fragment length,
    their rows to the same memory. So these topologies collect the same data (only the
    processes' names and the split of their reports differ), and their runs differ as two
    runs of 2a1m1l do, by the timing of an asynchronous run. Run in turn
    (topology.lanes=false), they would not."""
    from conftest import make_cfg
    from walle_ray.algos import algorithm_for
    from walle_ray.runtime.role_setup import sampler_envs, sampler_slots
    from walle_ray.topology import plan_packing

    def samplers(topology: str, *overrides: str) -> tuple[int, list]:
        cfg = make_cfg("algo=impala", "env=pong", f"topology.spec={topology}", *overrides)
        algo, topo = algorithm_for(cfg.algo), parse_topology(topology)
        packing = plan_packing(topo, 2)
        lanes, envs = sampler_envs(cfg, algo, topo, packing)
        names = {k: f"walle/memory-{k}" for k in range(topo.memories)}
        out = []
        for group, rows in zip(packing.samplers, lanes):
            for slot in sampler_slots(cfg, algo, topo, group, rows, names):
                width = rows or cfg.env.envs_per_sampler  # a route's part as its rows
                routes = [(ref, part if isinstance(part, list) else
                           list(range(width))[part if part is not None else slice(None)])
                          for ref, part in slot.routes]
                out.append((slot.cls, plain(slot.args), slot.kwargs, routes))
        return envs, out

    def plain(args):  # a partial compares by identity: by its function and arguments instead
        if isinstance(args, functools.partial):
            return args.func, plain(args.args), plain(args.keywords)
        if isinstance(args, (tuple, list)):
            return type(args)(plain(a) for a in args)
        return {k: plain(v) for k, v in args.items()} if isinstance(args, dict) else args

    envs, slots = samplers("2a1m1l")
    assert envs == 16 and len(slots) == 2 and samplers(spec) == (envs, slots)
    envs, apart = samplers(spec, "topology.lanes=false")
    assert envs == 8 * int(spec.split("a")[0]) and apart != samplers("2a1m1l")[1]


def test_a_lanes_report_is_one_report_per_logical_sampler():
    """What a process of lanes collected, as the reports of its logical samplers: steps and
    seconds shared (their sums and each sampler's time shares kept), episodes and failures
    once, the fragments under each."""
    from walle_ray.runtime.sampler_worker import split_lanes

    total = {"sampler": 1, "env_steps": 1000, "collect_s": 3.0, "put_wait_s": 0.3,
             "weights_wait_s": 0.03, "env_s": 1.5, "act_s": 1.2, "cpu_s": 2.7, "fragments": 4,
             "episode_returns": [-21.0, -20.0], "episode_lengths": [800, 900],
             "sampler_restarts": 1, "lost_fragments": 1, "transitions": 0,
             "policy_version": 7, "explore/temperature": 1.0}
    reports = split_lanes(total, (1, 3, 5))
    assert [r["sampler"] for r in reports] == [1, 3, 5] and [r["lane"] for r in reports] == [0, 1, 2]
    assert [r["env_steps"] for r in reports] == [334, 333, 333]
    for key in ("collect_s", "put_wait_s", "weights_wait_s", "env_s", "act_s", "cpu_s"):
        assert sum(r[key] for r in reports) == pytest.approx(total[key])
        assert reports[1][key] / reports[1]["collect_s"] == pytest.approx(
            total[key] / total["collect_s"])
    assert reports[0]["episode_returns"] == [-21.0, -20.0] and reports[2]["episode_lengths"] == []
    assert [r["sampler_restarts"] for r in reports] == [1, 0, 0]
    assert [r["lost_fragments"] for r in reports] == [1, 0, 0]
    assert all(r["fragments"] == 4 and r["policy_version"] == 7
               and r["explore/temperature"] == 1.0 for r in reports)
    # The run counts the process's 4 fragments once, in its metrics and in every memory it
    # feeds, while each sampler is credited with them.
    from walle_ray.runtime.loop import Interval
    from walle_ray.runtime.times import RunTimes

    interval, times = Interval(), RunTimes(memories_of_sampler=lambda i: [0, 1])
    for report in reports:
        interval.add_sampler(report)
        times.add_sampler(report)
    assert interval.fragments == 4 and interval.steps == 1000
    assert [times.totals["memories"][k]["fragments_in"] for k in ("0", "1")] == [4, 4]
    assert [times.totals["samplers"][str(i)]["fragments"] for i in (1, 3, 5)] == [4, 4, 4]


def test_topology_pack_takes_auto_off_or_a_number():
    from conftest import make_cfg

    from walle_ray.algos import validate

    for value in ("auto", "off", "3"):
        validate(make_cfg(f"topology.pack={value}"))
    with pytest.raises(ConfigError, match=r"^topology\.pack: got 'some'; use auto, off or a"):
        validate(make_cfg("topology.pack=some"))


def test_roles_confined_to_some_nodes_get_shares_those_nodes_hold():
    from walle_ray.topology import fit_to_nodes

    # samplers on a 2-CPU node with 'envs', the packed learner on a 2-CPU node with 'trainer'
    processes = Topology(samplers=4, memories=2, learners=1)
    plan = plan_resources(processes, cluster_cpus=4)
    nodes = [{"CPU": 0.0}, {"CPU": 2.0, "envs": 8.0}, {"CPU": 2.0, "trainer": 4.0}]
    resources = {"sampler": {"envs": 1}, "learner": {"trainer": 1}}
    fitted = fit_to_nodes(plan, processes, resources, nodes)
    assert plan.sampler_cpus * 4 > 2 and fitted.sampler_cpus * 4 + 0.03 <= 2.0
    assert fitted.learner_cpus == plan.learner_cpus == 1.0
    # both roles on the same nodes: the samplers take what the learner leaves
    both = [{"CPU": 2.0, "envs": 8.0, "trainer": 4.0}, {"CPU": 2.0, "envs": 8.0, "trainer": 4.0}]
    assert fit_to_nodes(plan, processes, resources, both) == plan
    assert fit_to_nodes(plan, processes, resources, both[:1]).sampler_cpus * 4 + 1.0 + 0.03 <= 2.0
    # unconfined roles keep the plan; a share the user set is refused, not cut
    assert fit_to_nodes(plan, processes, {}, nodes) == plan
    with pytest.raises(ConfigError, match="topology.resources.sampler: the 1 node"):
        fit_to_nodes(plan, processes, resources, nodes, {"sampler": plan.sampler_cpus})


def test_an_equal_share_fits_every_process_on_the_nodes_left():
    from walle_ray.topology import equal_share

    # 2 nodes of 2 CPUs, a learner of 1 CPU on one: 4 samplers of 0.7425 fit in total (2.97)
    # but not node by node (1 and 2 CPUs left hold 1 and 2 of them)
    share = equal_share([1.0, 2.0], 4, 0.7425)
    assert share == 0.6666 and int(1.0 / share) + int(2.0 / share) >= 4
    assert equal_share([2.0, 2.0], 4, 0.5) == 0.5  # fits as planned
    assert equal_share([0.0], 2, 0.5) == 0.0  # no room at all


def test_the_samplers_share_is_cut_to_the_cpus_the_other_roles_leave_on_their_nodes():
    from walle_ray.topology import sampler_share_left

    nodes = [{"NodeID": "a", "Resources": {"CPU": 2.0}},
             {"NodeID": "b", "Resources": {"CPU": 2.0, "sim": 1.0}},
             {"NodeID": "c", "Resources": {"CPU": 2.0}}]
    placed = [("a", 1.0), ("a", 0.25), ("b", 0.5)]  # a learner and a memory on a, the ps on b
    # on a and b: 0.75 and 1.5 CPUs left, room for 3 samplers of 0.75, not 4
    assert sampler_share_left(nodes[:2], {}, placed, 3, 0.75, by_hand=False) == 0.75
    assert sampler_share_left(nodes[:2], {}, placed, 4, 0.75, by_hand=False) == 0.5
    with pytest.raises(ConfigError, match="4 sampler process.*CPUs left there: 0.75, 1.5"):
        sampler_share_left(nodes[:2], {}, placed, 4, 0.75, by_hand=True)
    # samplers that ask for "sim" run only on b: 3 of 0.5 fill its 1.5 CPUs left
    assert sampler_share_left(nodes, {"sim": 1.0}, placed, 3, 1.0, by_hand=False) == 0.5
    with pytest.raises(ConfigError, match="do not fit"):  # no room at all
        sampler_share_left(nodes, {"sim": 1.0}, [("b", 2.0)], 1, 1.0, by_hand=False)
