"""A3R research layer: an autonomous research agent that plans, runs and analyses agentic RL
experiments on the swarm engine, keeping its knowledge in `memory`.

The command line lives in `a3r.app.cli` (console script ``a3r``).
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
