"""The runtime: engines, trainer and scorers wired into one run (layer 5).

Its rooms, bottom to top; each imports only from the rooms below it and from layers 1-4
(``tests/house/test_layers.py`` holds the code to this):

* ``view``: the live progress view and the end-of-run summary a person reads.
* ``drivers``: the rollout drivers that run inside the engine worker (multi-turn episodes,
  agents behind a recording OpenAI endpoint, the environment loop they share).
* ``workers``: the engine and trainer worker processes, their typed messages, and the plumbing
  that makes a worker's failure reach the orchestrator at once.
* ``backends``: where workers run: ``local`` (processes on this machine, a fork server) and
  ``ray`` (actors on a cluster), each offering the orchestrator the same small surface.
* ``run``: the run folder and its checkpoints, what a run holds outside it, the checks made
  before anything starts.
* ``orchestrator``: the loop that keeps tokens flowing, and what it consults (held-out rounds,
  step metrics, seeds, restarts, a run's state); also the synchronous reference loop.
* ``launch``: start, resume and finish a run (what ``tokenflow train`` calls).

May import: layers 1-4; each room, only the rooms below it in the order above.

A regular package (not a namespace one) so that setuptools' package finder ships it in a wheel
and the API reference can document it. Nothing is imported here: ``import tokenflow`` stays light.
"""
