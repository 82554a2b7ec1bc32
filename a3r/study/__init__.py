"""The study's plain logic and data: plan schemas (`plans`), run types (`runs`), detectors and
statistics (`analysis`), sweep stages and verdicts (`research`), patch rules (`patches`), the
report (`report`) and a run's provenance (`provenance`: git commit, dirty flag, machine, versions).
It imports only `a3r.errors`, `memory` and `templates` from outside itself.
"""
