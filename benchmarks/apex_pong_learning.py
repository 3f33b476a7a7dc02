"""Ape-X DQN on Pong: minutes and agent steps to a mean score of 17, on this machine.

    python benchmarks/apex_pong_learning.py [--minutes 45] [--topology 4a8m1l]

One run of ``python -m walle_ray algo=apex env=pong topology=4a8m1l`` with the preset's
settings (42x42 frames, 8 prioritized shards, 3-step double-Q, dueling head, a replay ratio
of 4), stopped when the mean of the last 20 episodes reaches 17 or after ``--minutes``
(RLlib's Ape-X reached about 19 in under 40 minutes on a far larger machine). Writes
benchmarks/results/apex_pong_learning.json and .png, as the IMPALA benchmark does.
"""

from __future__ import annotations

import argparse

from common import learning_run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=45)
    p.add_argument("--topology", default="4a8m1l")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    learning_run("apex_pong_learning",
                 ["algo=apex", "env=pong", f"topology={args.topology}", f"run.seed={args.seed}"],
                 target=17.0, minutes=args.minutes,
                 title=f"Ape-X DQN Pong 42x42 {args.topology}, 2 CPU cores")


if __name__ == "__main__":
    main()
