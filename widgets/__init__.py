"""The Jupyter UI over the public API (imported as `workbench.widgets`)."""

from .audio import ABAudio
from .live import LiveStagePlot
from .player import ABPlayer, SyncedVideos

__all__ = ["ABAudio", "ABPlayer", "LiveStagePlot", "SyncedVideos"]
