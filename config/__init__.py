"""The configuration layer, below oracle, formats and solver: the integer coding of the
configuration enums (:mod:`config.codes`) and the one resolver of derived fields over a columnar
batch (:mod:`config.resolve`). It imports only the specs (``oracle/specs.py``)."""
