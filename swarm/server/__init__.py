"""The swarm server: the FastAPI app (`swarm.server.app.create_app`) and what it composes
(`swarm.server.runtime.SwarmRuntime`).

This package face imports nothing: importing any ``swarm.server.<module>`` runs it first, so a face that
imported the app would run the app, the runtime and every route from inside each of their own imports
(``tests/test_layers.py`` reports such a loop). Import from the modules themselves.
"""
