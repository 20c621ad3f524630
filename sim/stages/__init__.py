"""RL stages of RLSim: training, generation and weight sync, each timed on the network simulator."""
