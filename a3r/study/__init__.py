"""The study's plain logic and data: plan schemas (`plans`), run types (`runs`), detectors and
statistics (`analysis`), sweep stages and verdicts (`research`), patch rules (`patches`) and the
report (`report`). It imports only `a3r.errors`, `memory` and `templates` from outside itself.
"""
