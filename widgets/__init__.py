"""The Jupyter UI over the public API (imported as `workbench.widgets`)."""

from .audio import ABAudio, AudioPlayer
from .calibrate import CalibrationPanel
from .dashboard import Dashboard
from .fanout import FanoutProgress
from .live import LiveStagePlot
from .panel import AccelerationPanel
from .player import ABPlayer, SyncedVideos

__all__ = [
    "ABAudio",
    "ABPlayer",
    "AudioPlayer",
    "AccelerationPanel",
    "CalibrationPanel",
    "Dashboard",
    "FanoutProgress",
    "LiveStagePlot",
    "SyncedVideos",
]
