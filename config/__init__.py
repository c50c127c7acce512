"""The configuration layer: what a configuration is, declared once.

The lowest layer of tune-cp, below ``oracle`` (memory and time), ``formats`` (framework I/O)
and ``solver`` (legality, CP-SAT, check): the axis registry (``config/axes.py``: every
``ParallelConfig`` field a user, the search or the planner sets, and the search axes with their
domains, labels and columns), the integer coding of the configuration enums
(``config/codes.py``), the one resolver of derived fields over a columnar batch
(``config/resolve.py``) and the specs they describe (``config/specs.py``: the frozen pydantic
models and their enums). Modules here import only each other, numpy and the standard library,
never a higher layer (``tests/test_import_graph.py``).
"""
