"""Helpers for MindSpore training loops (``MsprobeStep``)."""
