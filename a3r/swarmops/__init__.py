"""Operating swarm from a3r: subprocesses (`processes`), executing and watching one run
(`execution`, `monitoring`) and the held-out evaluation client (`evaluate`). Below the research graph:
nothing here imports `a3r.graph`, `a3r.providers` or `a3r.app`.
"""
