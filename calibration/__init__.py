"""Calibration: fitting the time model's constants to published runs and to training logs.

``calibrate.py`` fits the constants of ``oracle/catalog/calibration.json`` to the published rows
(``benchmarks/published_runs.csv`` read through ``formats/runs.py``); ``refit.py`` refits them
to a user's own training logs (``tune-cp calibrate --log``, read through ``formats/logs.py``) and
checks the logged configurations with the solver. It sits above ``oracle``, ``formats`` and
``solver``, whose models it fits and whose readers it uses; nothing below imports it
(``tests/test_import_graph.py``).
"""
