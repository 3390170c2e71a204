"""Where the workers run, behind one surface the orchestrator talks to (``engines``,
``trainer``, ``recv``, ``broadcast``, ``check``, ``shutdown``):

* ``local``: spawned or fork-server processes on this machine, no services;
* ``ray``: Ray actors on one machine or a cluster, with restarts and a scorer pool of actors.

May import: layers 1-4 and ``runtime.view``, ``runtime.drivers``, ``runtime.workers``.
"""
