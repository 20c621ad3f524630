"""Data files of RLSim (``mfu_points.yaml``: the published training throughput the MFU model is
calibrated on); a package only so that the files ship with it."""
