"""OCS device layer: the vendor-neutral device model, the TL1 dialect, a TCP driver and an emulator.

See ``docs/ocs.md``. Modules: :mod:`.model` (ports, cross-connects, ``SwitchState``, the
``OcsDeviceClient`` protocol, full-duplex mapping), :mod:`.tl1` (format/parse), :mod:`.driver`
(``Tl1Driver``), :mod:`.devices` (``devices.yaml``), :mod:`.emulator` and :mod:`.emulator_control`
(emulated switch, fault injection, subprocess launcher), :mod:`.errors`.
"""
