"""What the replay-based algorithms (DQN, Ape-X, DDPG, TD3) share: settings, checks, wiring."""
