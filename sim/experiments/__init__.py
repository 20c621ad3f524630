"""Paper experiments on the network simulator: each prints the paper's value, ours and their ratio.

The ratio is information, never a pass mark: where ours differs, ``docs/sim.md`` says why.
"""
