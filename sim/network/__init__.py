"""The network half of RLSim: six fabrics as capacity graphs, max-min fair flow rates, an event loop,
RFabric circuits in time from the real controller, and collectives as flows with a timing cache.

Start with :class:`NetworkSim` (time patterns and collectives on a fabric) and, for RFabric driven by
intents, :class:`RFabricDriver`. ``docs/sim.md`` describes the model and its validation.
"""

from sim.network.build import build_fabric
from sim.network.collectives import CollectiveTiming, collective_flows, groups_of, intent_flows
from sim.network.config import FABRICS, SimConfig
from sim.network.events import FlowResult, FlowSet, simulate
from sim.network.fabrics import Failures, MixNetCircuit
from sim.network.netsim import NetworkSim
from sim.network.reconfig import RFabricDriver

__all__ = ["FABRICS", "SimConfig", "build_fabric", "FlowSet", "FlowResult", "simulate", "Failures", "MixNetCircuit",
           "NetworkSim", "RFabricDriver", "CollectiveTiming", "collective_flows", "intent_flows", "groups_of"]
