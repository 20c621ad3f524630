"""RLSim for RollArt: the agentic runtime's own objects (proxy, managers, buffer, routing, bound) on a
virtual clock (``clock``), at cluster scale with H800 and H20 pools (``cluster``). Figures:
``sim/experiments/rollart_*.py``; docs/agentic.md.
"""
