"""The training half of RLSim's arithmetic: FLOP accounting, the MFU model and its calibration,
the step model shared by calibration and the training stage, and the 1F1B pipeline schedule."""
