"""The web console at ``/ui`` and the JSON API at ``/api/`` it is built on.

:class:`Console` answers the HTTP server's requests for both; :mod:`bridge.console.api` calls
the operator's tools (:mod:`bridge.ops`) for the API, :mod:`bridge.console.pages` renders the
pages from the API's answers, :mod:`bridge.console.chart` counts and draws what falls due.
"""

from bridge.console.web import Console, Response

__all__ = ["Console", "Response"]
