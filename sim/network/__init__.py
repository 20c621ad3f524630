"""The network half of RLSim: six fabrics as capacity graphs, max-min fair flow rates, an event loop,
RFabric circuits in time from the real controller, and collectives as flows with a timing cache.

Start with :class:`NetworkSim` (time patterns and collectives on a fabric) and, for RFabric driven by
intents, :class:`RFabricDriver`. ``docs/sim.md`` describes the model and its validation.
"""

from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.collectives import CollectiveTiming, collective_flows, groups_of, intent_flows
from orchestrl.sim.network.config import FABRICS, SimConfig
from orchestrl.sim.network.events import FlowResult, FlowSet, simulate
from orchestrl.sim.network.fabrics import Failures, MixNetCircuit
from orchestrl.sim.network.netsim import NetworkSim
from orchestrl.sim.network.reconfig import RFabricDriver

__all__ = ["FABRICS", "SimConfig", "build_fabric", "FlowSet", "FlowResult", "simulate", "Failures", "MixNetCircuit",
           "NetworkSim", "RFabricDriver", "CollectiveTiming", "collective_flows", "intent_flows", "groups_of"]
