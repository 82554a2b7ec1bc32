"""The base of the multi-agent game templates (``who_is_the_spy``, ``werewolves``).

* :mod:`.table`: seats numbered from 1, agent names ``<role>_<rank>``, each seat's append-only chat
  history, asking players, counting votes and the hidden team's win rule;
* :mod:`.reward`: a team win less penalties per rule broken, per agent and over the trainable agents;
* :mod:`.players`: the workflow side: one OpenAI-backed player per seat, on the episode's server, a team's
  server or the opponent endpoint.

A game template keeps its own rules, prompts, readers and reward weights; a rendered game workspace
imports this base from the installed ``templates`` package, as it imports `templates._loader`.
"""
