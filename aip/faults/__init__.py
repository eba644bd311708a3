"""Fault injection for the reliability tests and ``aip bench faults``.

``fuzz`` builds bad input with a known verdict per record, ``worker`` runs real
``aip worker`` processes (start, SIGKILL, restart, metrics, RSS), and
``scenarios`` runs the five fault tests against a real broker; the tests under
``tests/integration/test_faults*.py`` and the benchmark share them.
"""
