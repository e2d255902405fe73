"""The chaos harness: faults injected into real processes, every delay-topic offset accounted for.

``python -m tests.chaos`` (``make chaos``) runs the full scenarios and prints the table docs/reliability.md
shows; ``test_chaos.py`` runs a short version of each in ``make test``.
"""
