"""Swarm clients: open episodes on swarm servers and run agent workflows in them."""

from swarm.client._client import AsyncEpisode, AsyncSwarmClient, Episode, RetryPolicy, SwarmClient
from swarm.client.workflow import LLM, Result

__all__ = ["LLM", "AsyncEpisode", "AsyncSwarmClient", "Episode", "Result", "RetryPolicy", "SwarmClient"]
