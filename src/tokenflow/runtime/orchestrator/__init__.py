"""The orchestrator and what it consults.

* ``orchestrator``: the main loop (admit, score, batch, dispatch, evaluate);
* ``inbox``: every worker message routed to what it changes, and the silent-worker watchdog;
* ``run_state``: what a checkpoint saves, how a resume restores it, the summary;
* ``checkpoints``: taking one without stopping training (snapshot, background commit), and the
  in-flight rollouts it keeps;
* ``heldout``, ``learning_signal``, ``step_metrics``, ``seeds``, ``restarts``,
  ``calibration_log``: one concern each;
* ``sync_loop``: a plain synchronous loop in one process, the reference the async runtime is
  checked against.

May import: layers 1-4 and every runtime room below it (view, drivers, workers, backends, run).
"""
