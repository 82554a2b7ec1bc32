"""The swarm server: FastAPI app factory and runtime."""

from swarm.server.app import create_app
from swarm.server.runtime import SwarmRuntime

__all__ = ["SwarmRuntime", "create_app"]
