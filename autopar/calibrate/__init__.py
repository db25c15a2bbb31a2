"""Calibration on the user's own hardware: ``autopar calibrate`` measures GEMMs, attention,
memory bandwidth and collectives (:mod:`.run`, :mod:`.bench`, :mod:`.comm_bench`) into a
calibration file (:mod:`.schema`) that the cost model then uses in place of datasheet constants
(:mod:`.fit`); ``autopar measure`` runs a plan's training steps and records the run with the
prediction's error (:mod:`.measure`). See docs/calibrate.md.

Only the file format and the mapping are imported here (``autopar.api`` and
``autopar.reestimate`` use them); the benchmark runners import torch.distributed machinery and
are imported where they run.
"""

from .fit import Calibrated, calibrated, measured_cluster, measured_device
from .schema import Calibration, check_calibration, load_calibration

__all__ = ["Calibration", "Calibrated", "calibrated", "check_calibration", "load_calibration",
           "measured_cluster", "measured_device"]
