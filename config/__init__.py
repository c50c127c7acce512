"""The configuration layer: what a configuration is, declared once.

The lowest layer of tune-cp, below ``oracle`` (memory and time), ``formats`` (framework I/O)
and ``solver`` (legality, CP-SAT, check): the axis registry (``config/axes.py``: every
``ParallelConfig`` field a user, the search or the planner sets, and the search axes with their
domains, labels and columns) and the specs it describes (``oracle/specs.py``, to move here).
Modules here import only the specs and the standard library, never a higher layer.
"""
