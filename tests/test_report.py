"""The bottleneck report: the classifier on constructed figures, the accumulator on constructed
reports, and real runs through the command line (sampler-bound, learner-bound, starved)."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli
from walle_ray.bottleneck import (BATCH_WAIT_BOUND, LEARNER_BUSY_BOUND, SAMPLER_BLOCKED_BOUND,
                                  SPLIT_BOUND, STARVED_IDLE, SYNC_WAIT_BOUND, Figures, build_report,
                                  classify)
from walle_ray.report import main
from walle_ray.runtime.times import RunTimes, memory_fill

ASYNC = dict(alternating=False, env_share=0.6, act_share=0.2)


# ----------------------------------------------------------------------------- classify

def test_busy_learners_and_blocked_samplers_are_learner_bound():
    verdict, advice = classify(Figures(**ASYNC, busy_share=0.97, put_wait_share=0.4))
    assert verdict == "learner-bound"
    assert advice.startswith("learner-bound: learners busy 97%, samplers blocked 40% on full "
                             "memories; add learners, set learner.num_gpus=1")


def test_learners_on_gpus_are_not_told_to_use_a_gpu():
    for synchronous in (False, True):
        advice = classify(Figures(**ASYNC, synchronous=synchronous, gpu=True, busy_share=0.97,
                                  put_wait_share=0.4))[1]
        assert "num_gpus" not in advice and "a GPU of its own" in advice


def test_blocked_samplers_alone_make_a_run_learner_bound():
    f = Figures(**ASYNC, busy_share=0.5, put_wait_share=SAMPLER_BLOCKED_BOUND)
    assert classify(f)[0] == "learner-bound"


def test_waiting_learners_and_env_bound_samplers_are_sampler_bound():
    f = Figures(alternating=False, env_share=0.85, act_share=0.1, busy_share=0.4,
                batch_wait_share=0.6)
    verdict, advice = classify(f)
    assert verdict == "sampler-bound"
    assert advice == ("sampler-bound: learners wait 60% for batches, samplers spend 85% in env "
                      "steps; add samplers or env.envs_per_sampler")


def test_inference_bound_samplers_are_told_to_batch_the_act():
    f = Figures(alternating=False, env_share=0.2, act_share=0.7, batch_wait_share=0.5)
    verdict, advice = classify(f)
    assert verdict == "sampler-bound" and "70% in the policy's act" in advice
    assert "env.envs_per_sampler to batch inference" in advice


def test_a_memory_with_no_sampler_starves_the_run_before_anything_else():
    f = Figures(**ASYNC, busy_share=0.0, put_wait_share=0.9, batch_wait_share=0.5,
                sync_wait_share=0.5, starved=(1,), starved_unfed=(1,))
    verdict, advice = classify(f)
    assert verdict == "starved"
    assert advice.startswith("starved by one memory: memory-1 serves 0 batches (no sampler "
                             "writes to it) while the learners wait 100%; give it samplers "
                             "(A >= M")


def test_a_starved_memory_whose_learners_are_busy_is_not_the_verdict():
    f = Figures(**ASYNC, busy_share=0.9, batch_wait_share=STARVED_IDLE - 0.2, starved=(1,))
    assert classify(f)[0] == "learner-bound"


def test_learners_waiting_for_each_other_are_sync_bound():
    f = Figures(**ASYNC, busy_share=0.5, sync_wait_share=SYNC_WAIT_BOUND + 0.05)
    assert classify(f)[0] == "sync-bound"


def test_nothing_past_a_threshold_is_balanced():
    f = Figures(**ASYNC, busy_share=LEARNER_BUSY_BOUND - 0.1,
                put_wait_share=SAMPLER_BLOCKED_BOUND - 0.1,
                batch_wait_share=BATCH_WAIT_BOUND - 0.1)
    verdict, advice = classify(f)
    assert verdict == "balanced" and advice.startswith("balanced: learners busy 75%")


@pytest.mark.parametrize("collect,verdict", [(0.8, "sampler-bound"), (0.2, "learner-bound"),
                                             (0.5, "balanced")])
def test_alternating_runs_are_judged_by_their_split(collect, verdict):
    f = Figures(alternating=True, synchronous=True, collect_share=collect,
                learn_share=1 - collect, env_share=0.9, act_share=0.05)
    assert classify(f)[0] == verdict
    assert SPLIT_BOUND > 0.5  # the split's two sides cannot both pass it


def test_local_advice_names_a_ray_topology():
    f = Figures(alternating=True, synchronous=True, local=True, collect_share=0.9,
                learn_share=0.1, env_share=0.9)
    assert "use a Ray topology with several samplers" in classify(f)[1]


# ----------------------------------------------------------------------------- accumulating

def sampler_report(i, env_s, act_s, put_wait_s=0.0, **extra):
    return {"sampler": i, "env_steps": 100, "fragments": 4, "env_s": env_s, "act_s": act_s,
            "collect_s": env_s + act_s, "put_wait_s": put_wait_s, "episode_returns": [],
            "episode_lengths": [], **extra}


def test_accumulated_reports_make_the_figures_and_the_paragraph():
    times = RunTimes({"algo": "impala", "env": "cartpole", "topology": "2a2m1l",
                      "loop": "async", "local": False, "learners": 1, "feeders": [1, 1]},
                     memories_of_sampler=lambda i: [i % 2])
    for _ in range(3):
        times.add_sampler(sampler_report(0, env_s=0.5, act_s=0.1, put_wait_s=0.4))
        times.add_sampler(sampler_report(1, env_s=0.5, act_s=0.1, put_wait_s=0.4,
                                         weights_wait_s=0.0))
        times.add_learner({"updates": 8, "train_s": 1.0, "batch_wait_s": 0.02,
                           "sync_wait_s": 0.0, "env_steps_consumed": 640})
        times.add_record(1.0, None, [{"queue_size": 60, "queue_capacity": 64, "rows_out": 100},
                                     {"size": 10, "capacity": 100, "fill": 0.1, "sampled": 0}])
    report = build_report(times.run_totals(), times.meta, {"env_steps": 600, "updates": 24})
    assert report["verdict"] == "learner-bound"
    assert report["samplers"]["env_share"] == pytest.approx(0.5)
    assert report["samplers"]["put_wait_share"] == pytest.approx(0.4)
    assert report["learners"]["busy_share"] == pytest.approx(0.98)
    m0, m1 = report["memories"]
    assert m0["fill_mean"] == pytest.approx(60 / 64) and m0["served_rows"] == 100
    assert m1["fragments_in"] == 12 and m1["served_rows"] == 0
    assert report["summary"].startswith("walle_ray: where the time went (impala cartpole 2a2m1l,")
    assert "the 2 samplers spent 50% of their time in env steps" in report["summary"]
    paragraph, cost = report["summary"].splitlines()
    assert paragraph.endswith(f"Advice: {report['advice']}.")
    assert cost == ("walle_ray: time and cost: no milestone reached; the run: 0.0 min, "
                    "0.00 core-hours")


def test_each_learner_process_has_its_own_figures():
    """Two learner processes (learner-0,1 packed, learner-2,3 packed): a slow one shows."""
    times = RunTimes({"algo": "impala", "env": "pong", "topology": "8a4m4l", "loop": "async",
                      "local": False, "learners": 4, "feeders": [2, 2, 2, 2]},
                     memories_of_sampler=lambda i: [i % 4])
    for _ in range(2):
        times.add_learner({"learner": "0,1", "updates": 4, "train_s": 1.0, "batch_wait_s": 0.1,
                           "sync_wait_s": 0.0})
        times.add_learner({"learner": "2,3", "updates": 4, "train_s": 1.0, "batch_wait_s": 0.6,
                           "sync_wait_s": 0.0})
        times.add_record(1.0, None, [])
    report = build_report(times.run_totals(), times.meta)
    first, second = report["learners"]["per_learner"]
    assert first["shards"] == "0,1" and first["batch_wait_share"] == pytest.approx(0.1)
    assert second["shards"] == "2,3" and second["batch_wait_share"] == pytest.approx(0.6)
    assert report["learners"]["batch_wait_share"] == pytest.approx(0.35)
    assert ("(learner-0,1 computed 90%, waited 10% for batches, learner-2,3 computed 40%, "
            "waited 60% for batches)") in report["summary"]


def test_a_resumed_run_adds_its_totals_to_the_earlier_ones(tmp_path):
    meta = {"algo": "ppo", "env": "cartpole", "topology": "local", "loop": "sync",
            "local": True, "learners": 1, "feeders": [1]}
    first = RunTimes(meta)
    first.add_sampler(sampler_report(0, env_s=1.0, act_s=0.0))
    first.add_record(2.0, {"collect_s": 1.0, "learn_s": 1.0}, [])
    first.finish(tmp_path, {"env_steps": 100})
    previous = json.loads((tmp_path / "report.json").read_text())["totals"]
    second = RunTimes(meta, previous=previous)
    second.add_sampler(sampler_report(0, env_s=3.0, act_s=0.0))
    second.add_record(4.0, {"collect_s": 3.0, "learn_s": 1.0}, [])
    report = second.finish(tmp_path, {"env_steps": 200})
    assert report["run"]["segments"] == 2 and report["run"]["wall_s"] == 6.0
    assert report["iterations"]["collect_share"] == pytest.approx(4 / 6)
    assert "over 2 runs" in report["summary"] and report["verdict"] == "sampler-bound"


def test_memory_fill_reads_every_memory_type():
    assert memory_fill({"queue_size": 32, "queue_capacity": 64, "uniform_size": 0,
                        "uniform_capacity": 64}) == (0.25, 32.0)
    assert memory_fill({"size": 5, "capacity": 10, "fill": 0.5}) == (0.5, 5.0)
    assert memory_fill({"depth": 1, "capacity": 4, "dropped": 0}) == (0.25, 1.0)


def test_the_command_line_refuses_a_directory_without_a_report(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"walle_ray.report: {tmp_path} has no report.json (a run from before the "
                   "bottleneck report)")
    assert main([str(tmp_path / "nowhere")]) == 2


# ----------------------------------------------------------------------------- real runs

FAST = ["logger.progress=line", "run.stop_at_return=null", "run.checkpoint_every=1000"]


def report_of(run_dir, out: str) -> dict:
    """The run's report.json, after checking that the run printed its paragraph and that
    ``python -m walle_ray.report`` prints the same one."""
    report = json.loads((run_dir / "report.json").read_text())
    assert all(line in out.splitlines() for line in report["summary"].splitlines())
    again = subprocess.run([sys.executable, "-m", "walle_ray.report", str(run_dir)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60, check=True)
    said = again.stdout.strip()  # the paragraph, then what topology=auto would choose
    assert said.startswith(report["summary"])
    assert said.splitlines()[-1].startswith(("walle_ray: from this run's costs on ",
                                             "walle_ray: topology=auto: this run measured too little"))
    return report


def test_a_slow_env_is_sampler_bound(tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli("topology=local", "env=cartpole", "env.id=walle/Sleep-v0",
                  "++env.kwargs={step_s: 0.004}", "env.envs_per_sampler=1",
                  "algo.batch_size=256", "algo.minibatch_size=128", "algo.epochs=1",
                  "run.total_env_steps=768", "run.max_wall_s=40", f"hydra.run.dir={run_dir}",
                  *FAST).stdout
    report = report_of(run_dir, out)
    assert report["verdict"] == "sampler-bound", report["summary"]
    assert report["samplers"]["env_share"] > 0.8
    assert report["iterations"]["collect_share"] > SPLIT_BOUND


def test_a_large_batch_on_a_small_net_is_learner_bound(tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli("topology=local", "env=cartpole", "env.envs_per_sampler=8",
                  "algo.batch_size=2048", "algo.minibatch_size=32", "algo.epochs=4",
                  "run.total_env_steps=4096", "run.max_wall_s=40", f"hydra.run.dir={run_dir}",
                  *FAST).stdout
    report = report_of(run_dir, out)
    assert report["verdict"] == "learner-bound", report["summary"]
    assert report["iterations"]["learn_share"] > SPLIT_BOUND
    assert report["learners"]["updates"] == 2


def test_a_memory_without_samplers_starves_the_run(tmp_path):
    run_dir = tmp_path / "run"
    out = run_cli("algo=impala", "env=cartpole", "topology=1a2m2l", "env.envs_per_sampler=1",
                  "run.max_wall_s=10",
                  "run.report_every_s=2", "run.total_env_steps=10000000",
                  f"hydra.run.dir={run_dir}", *FAST, timeout=180).stdout
    report = report_of(run_dir, out)
    assert report["verdict"] == "starved", report["summary"]
    assert report["memories"][1]["samplers"] == 0 and report["memories"][1]["fragments_in"] == 0
    assert report["memories"][0]["fragments_in"] > 0
    assert "memory-1 serves 0 batches (no sampler writes to it)" in report["advice"]
    # Its sampler blocks on the full memory-0 in a call that never returns: said, not hidden.
    assert "0" in report["silent_samplers"] and "sampler-0 sent no report" in report["summary"]


def test_silent_samplers_are_the_topology_s_samplers_when_rows_are_dealt():
    # 2 samplers whose rows are dealt across 4 memories: each memory has 2 feeders, 8 in all,
    # but only sampler-0 and sampler-1 exist to fall silent.
    times = RunTimes({"algo": "impala", "env": "pong", "topology": "2a4m4l", "loop": "async",
                      "local": False, "learners": 4, "feeders": [2, 2, 2, 2], "samplers": 2},
                     memories_of_sampler=lambda i: [0, 1, 2, 3])
    times.add_record(1.0, None, [])
    assert sorted(times.silent()) == [0, 1]
