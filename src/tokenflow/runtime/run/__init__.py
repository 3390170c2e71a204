"""A run outside its loop: ``run_dir`` (the run folder and its checkpoints), ``resources`` (what a
run holds outside its folder, named after it, and the lock on it), ``preflight`` (the checks
made before a run creates its folder or starts a process), ``folder_guard`` (what makes a folder
a run folder; no links in it) and ``folder_code`` (code a run folder's config runs only when the
user says so).

May import: layers 1-4 and the runtime's rooms below it (view, drivers, workers, backends).
"""
