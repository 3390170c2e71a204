"""The orchestrator and what it consults.

* ``orchestrator``: the main loop (admit, score, batch, dispatch, end a step, evaluate);
* ``run_state``: `RunState`, the run's shared state, typed (every field declared where it is
  born), and what a checkpoint saves, how a resume restores it, the summary;
* ``inbox``: every worker message routed to what it changes, and the silent-worker watchdog;
* ``routing``: what goes to the engines (groups, groups again, sync specs, pause/resume);
* ``checkpoints``: taking one without stopping training (snapshot, background commit), and the
  in-flight rollouts it keeps;
* ``healing``: replacing dead workers; ``elastic`` (+ ``autoscale``): engines joining and leaving;
* ``run_trace``: the waits only the loop can see, as trace events;
* ``heldout``, ``learning_signal``, ``step_metrics``, ``seeds``, ``calibration_log``: one concern each;
* ``sync_loop``: a plain synchronous loop in one process, the reference the async runtime is
  checked against.

The helpers receive the `RunState` and the `Backend` (``runtime.backends.protocol``), never the
orchestrator, and call no private method of another file.

May import: layers 1-4 and every runtime room below it (view, drivers, workers, backends, run).
"""
