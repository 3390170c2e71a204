"""A run outside its loop: ``run_dir`` (the run folder and its checkpoints), ``resources`` (what a
run holds outside its folder, named after it, and the lock on it) and ``preflight`` (the checks
made before a run creates its folder or starts a process).

May import: layers 1-4 and the runtime's rooms below it (view, drivers, workers, backends).
"""
