"""``python -m bridge`` is the ``delay-bridge`` command."""

from bridge.cli import main

raise SystemExit(main())
