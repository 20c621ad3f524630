"""JigsawRL pipeline multiplexing (pure policy): sub-stage graphs, the slowdown model, merging, look-ahead.

Modules, bottom up: ``grid`` (slowdown grid files and their interpolation), ``interference`` (the
modelled grid, fitted to the paper), ``compare`` (modelled against measured, per point and kind),
``substage`` (step records, the bucket tracker, sub-stage graphs), ``ops`` (multiplexing a pair,
merging long tails, multiplexing-aware balancing), ``lookahead`` (the window scheduler, greedy and
exhaustive references). See docs/jigsaw.md.
"""
