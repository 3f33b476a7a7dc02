"""A run's ``report.json`` in words: the paragraph of where the time went and what the run
cost (``summary``), the milestones' own phrases (``describe_milestone``, also the line a
run prints when it reaches one), and the command line that prints the paragraph again,
``python -m walle_ray.report <run dir>``, with what ``topology=auto`` would choose for that
run. ``walle_ray/bottleneck.py`` builds the report.

This module imports neither torch nor Ray: the command line reads a report in an instant.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPORT_FILE = "report.json"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def summary(report: dict) -> str:
    """The paragraph printed at the end of a run and by ``python -m walle_ray.report``, and
    a line of its time and cost to each milestone."""
    run, s, lr, it = report["run"], report["samplers"], report["learners"], report["iterations"]
    over = f" over {run['segments']} runs" if run["segments"] > 1 else ""
    text = (f"walle_ray: where the time went ({run['algo']} {run['env']} {run['topology']}, "
            f"{run['wall_s']:.1f} s{over}): ")
    offline = report["figures"].get("offline", False)
    if it is not None and not offline:
        text += (f"collecting took {pct(it['collect_share'])} of the time and learning "
                 f"{pct(it['learn_share'])}; ")
    who, its = _role(s["count"], "sampler")
    if not offline:
        text += (f"{who} spent {pct(s['env_share'])} of {its} time in env steps, "
                 f"{pct(s['act_share'])} in the policy's act, {pct(s['put_wait_share'])} "
                 f"waiting on full memories and {pct(s['weights_wait_share'])} on weights; ")
    who, its = _role(run.get("learners"), "learner")
    others = ("" if run.get("learners") == 1
              else f" and {pct(lr['sync_wait_share'])} for each other")
    text += (f"{who} computed {pct(lr['busy_share'])} of {its} time, waited "
             f"{pct(lr['batch_wait_share'])} for batches{others} ({lr['updates']} updates)")
    per = lr.get("per_learner") or []
    if len(per) > 1:  # several learner processes: each one's, since one slow one holds all
        text += " (" + ", ".join(f"learner-{p['shards']} computed {pct(p['busy_share'])}, "
                                 f"waited {pct(p['batch_wait_share'])} for batches"
                                 for p in per) + ")"
    if offline:
        text += "; " + ", ".join(f"memory-{m['index']} served {m['served_rows']} recorded steps"
                                 for m in report["memories"])
    elif run["loop"] != "sync" and any(m["records"] or m["fragments_in"] for m in report["memories"]):
        text += "; " + ", ".join(_memory_phrase(m) for m in report["memories"])
    silent = report.get("silent_samplers") or {}
    if silent:
        names = ", ".join(f"sampler-{i}" for i in silent)
        text += (f"; {names} sent no report for the last {max(silent.values()):.0f} s (a call "
                 "that never returned: blocked on a full memory or on weights; its figures "
                 "count only the calls that did)")
    stalls = (report.get("faults") or {}).get("stalls", 0)
    if stalls:
        text += (f"; {stalls} stalled role{'s' if stalls > 1 else ''} found and restarted "
                 "(their stacks in stalls/)")
    text += f". Advice: {report['advice']}."
    if report.get("auto"):
        text += f"\nwalle_ray: {auto_line(report['auto'])}"
    if "cost" in report:  # reports from before time and cost to a score have none
        text += f"\nwalle_ray: time and cost: {cost_line(report.get('milestones', {}), report['cost'])}"
    return text


def _role(n: int | None, role: str) -> tuple[str, str]:
    """("the sampler", "its") or ("the 4 samplers", "their")."""
    if n == 1:
        return f"the {role}", "its"
    return (f"the {n} {role}s" if n else f"the {role}s"), "their"


def _memory_phrase(m: dict) -> str:
    fill = "" if m["fill_mean"] is None else f", {pct(m['fill_mean'])} full on average"
    n = m["samplers"]
    fed = ("its samplers" if n is None else "no sampler" if n == 0 else
           f"{n} sampler" + ("s" if n > 1 else ""))
    ranking = (f" and spent {pct(m['rank_share'])} of the run ranking replay rows"
               if m.get("rank_share") else "")
    return (f"memory-{m['index']} ({fed}{fill}) got {m['fragments_in']} fragments and served "
            f"{m['served_rows']} rows{ranking}")


def auto_line(auto: dict) -> str:
    """'topology=auto chose 2a1m1l: predicted 2300 agent steps/s (learner-bound), measured
    2100 (0.91x)'."""
    plan, measured = auto["plan"], auto.get("measured_rate") or 0.0
    text = (f"topology=auto chose {plan['spec']} with {plan['envs_per_sampler']} envs per "
            f"sampler and {plan['threads']} learner thread{'s' if plan['threads'] != 1 else ''}: "
            f"predicted {plan['rate']:.0f} agent steps/s ({plan['bound']})")
    if measured:
        text += f", measured {measured:.0f}"
        text += f" ({measured / plan['rate']:.2f}x)" if plan["rate"] > 0 else ""
    if auto.get("replans"):
        text += (f"; it re-planned {auto['replans']} time(s) as the cluster changed (the "
                 "measured rate spans every plan)")
    return text


def score_key(score: float) -> str:
    """A milestone's name in records and summaries (``run.milestones``): 17.0 -> '17'."""
    return f"{score:g}"


def describe_milestone(score: float, entry: dict) -> str:
    """'reached 17 after 13.2 min, 2.41M agent steps, 0.44 core-hours'."""
    steps = entry["agent_steps"]
    count = (f"{steps / 1e6:.2f}M" if steps >= 1e6 else f"{steps / 1e3:.1f}k" if steps >= 1e3
             else str(steps))
    text = (f"reached {score_key(score)} after {entry['minutes']:.1f} min, {count} agent steps, "
            f"{hours(entry['core_hours'])} core-hours")
    if entry.get("gpu_hours"):
        text += f", {hours(entry['gpu_hours'])} GPU-hours"
    return text


def hours(h: float) -> str:
    """0.4412 -> '0.44', 0.01234 -> '0.012': two decimals, or two digits below 0.1."""
    return f"{h:.2f}" if h >= 0.1 or h == 0 else f"{h:.2g}"


def cost_line(milestones: dict, cost: dict) -> str:
    """The milestones a run reached, in order of score, and what the whole run took:
    'reached 0 after ...; reached 17 after ...; the run: 14.0 min, 0.47 core-hours'."""
    whole = f"the run: {cost['minutes']:.1f} min, {hours(cost['core_hours'])} core-hours"
    if cost.get("gpu_hours"):
        whole += f", {hours(cost['gpu_hours'])} GPU-hours"
    reached = [describe_milestone(float(k), v)
               for k, v in sorted(milestones.items(), key=lambda kv: float(kv[0]))]
    return "; ".join(reached + [whole]) if reached else f"no milestone reached; {whole}"


def run_cost(counters: dict) -> dict:
    """What the whole run took (``runtime/milestones.py`` keeps it in the counters): wall
    minutes since its command started, core-hours, GPU-hours."""
    return {"minutes": counters.get("command_s", 0.0) / 60,
            "core_hours": counters.get("core_s", 0.0) / 3600,
            "gpu_hours": counters.get("gpu_s", 0.0) / 3600}


# ----------------------------------------------------------------------------- command line

def load_report(run_dir: Path) -> dict:
    """The report of a run directory; raises FileNotFoundError with a one-line reason."""
    path = Path(run_dir) / REPORT_FILE
    if not Path(run_dir).is_dir():
        raise FileNotFoundError(f"{run_dir} is not a directory")
    if not path.is_file():
        older = " (a run from before the bottleneck report)" if (
            Path(run_dir) / "metrics.jsonl").is_file() else " (not a run directory)"
        raise FileNotFoundError(f"{run_dir} has no {REPORT_FILE}{older}")
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> int:
    """``python -m walle_ray.report <run dir>``: print the run's summary paragraph again."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m walle_ray.report <run dir>", file=sys.stderr)
        return 2
    try:
        report = load_report(Path(args[0]))
    except (FileNotFoundError, ValueError) as exc:
        print(f"walle_ray.report: {exc}", file=sys.stderr)
        return 2
    print(report["summary"])
    print(f"walle_ray: {would_choose(report, Path(args[0]))}")
    return 0


def would_choose(report: dict, run_dir: Path) -> str:
    """What topology=auto would choose for this run, from the costs it measured
    (``autoplan.costs_from_report``), on the CPUs it ran on."""
    import yaml

    from walle_ray.autoplan import choose, costs_from_report

    path = run_dir / "config.yaml"
    config = yaml.safe_load(path.read_text()) if path.is_file() else {}
    costs = costs_from_report(report, config or {})
    cpus = report["run"].get("cpus")
    if costs is None or not cpus:
        return ("topology=auto: this run measured too little to say what auto would choose "
                "(no CPU seconds or no update in its report)")
    plan = choose(costs, [float(c) for c in cpus])
    return (f"from this run's costs on {sum(cpus):g} CPUs, topology=auto would choose "
            f"{plan.line(costs).removeprefix('auto: ')}")


if __name__ == "__main__":
    sys.exit(main())
