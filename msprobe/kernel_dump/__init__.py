"""MindSpore's GRAPH_MODE kernel dump (level L2) read into the msprobe event log.

:mod:`~msprobe.kernel_dump.layout` (directories, file names, execution order),
:mod:`~msprobe.kernel_dump.statistic_csv` (MindSpore's statistic dump),
:mod:`~msprobe.kernel_dump.ingest` (rows of kind ``kernel`` into the log). Nothing here
imports MindSpore, so ``msprobe export`` reads a kernel dump on any machine.
"""
