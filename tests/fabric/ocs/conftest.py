"""Fixtures for the OCS tests: emulators run as real subprocesses on ephemeral ports."""

from __future__ import annotations

import pytest

from orchestrl.fabric.ocs.driver import Tl1Driver
from orchestrl.fabric.ocs.emulator_control import EmulatorControl, start_emulator_process, stop_emulator_process

N = 16  # ports per side of the shared emulator: ingress 1..16, egress 17..32


@pytest.fixture(scope="module")
def emulator():
    """A rotor-profile emulator (0.01 ms switching) shared by one test module."""
    emu = start_emulator_process(N, "rotor")
    try:
        yield emu
    finally:
        stop_emulator_process(emu.process)


@pytest.fixture
def control(emulator):
    """Run-time control of the shared emulator, reset to no faults and an empty table around each test."""
    ctl = EmulatorControl(emulator.host, emulator.port)
    ctl.clear("ALL")
    yield ctl
    ctl.clear("ALL")


@pytest.fixture
def make_driver(emulator):
    """Factory of drivers on the shared emulator; every driver is closed after the test."""
    drivers: list[Tl1Driver] = []

    def make(**kwargs) -> Tl1Driver:
        kwargs = {"name": "emu0", "password": "admin", "timeout_s": 10.0, **kwargs}
        drv = Tl1Driver(emulator.host, emulator.port, **kwargs)
        drivers.append(drv)
        return drv

    yield make
    for drv in drivers:
        drv.close()
