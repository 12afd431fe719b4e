"""Synthetic captioned audio+video scenes and the detectors that check clips against captions."""
