"""Defaults of the legality rules that the command line shows in its flags' help, in a module
that imports nothing (``tune-cp --help`` loads no memory model); ``solver/rules.py`` uses and
re-exports them."""

#: Default ``--memory-margin``: the share of HBM kept free for what the model does not know
#: (allocator behaviour of a specific framework build, stray buffers). The named overhead terms
#: (context, collectives, fragmentation) are already inside the estimate.
DEFAULT_MEMORY_MARGIN = 0.05

#: Largest ``--memory-margin`` (grid key ``memory_margin``).
MAX_MEMORY_MARGIN = 0.9
