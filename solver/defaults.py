"""Defaults of the legality rules that the command line shows in its flags' help, in a module
that imports nothing (``tune-cp --help`` loads no memory model); ``solver/rules.py`` uses and
re-exports them."""

#: Default ``--memory-margin``: the share of HBM kept free for what the model does not know
#: (allocator behaviour of a specific framework build, stray buffers). The named overhead terms
#: (context, collectives, fragmentation) are already inside the estimate, so the margin is only
#: the rest: ``1 - 1/low``, ``low`` the smallest measured / predicted peak of the Megatron-family
#: published runs (``oracle/catalog/memory_spread.json``, 1.0027: 0.0027, rounded up to 0.003;
#: ``oracle/memory_verdict.py``, ``docs/memory_verdict.md``; ``tests/test_memory_verdict.py``
#: pins it to the file). A peak over this line is out of memory even at the favourable end of the
#: measured overheads.
DEFAULT_MEMORY_MARGIN = 0.003

#: Largest ``--memory-margin`` (grid key ``memory_margin``).
MAX_MEMORY_MARGIN = 0.9

#: ``--framework``'s values (``formats/frameworks.py::Framework``, which a test holds to this
#: tuple; spelt here so that the flag and the run settings load no formats module).
FRAMEWORK_NAMES = ("megatron-lm", "bridge", "primus", "torchtitan")
