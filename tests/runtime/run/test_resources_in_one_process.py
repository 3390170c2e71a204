"""Two runs of one folder in one process (train, then resume, in a notebook): the second run's
clearing of what a killed run left must not take the first run's semaphores that are still
waiting, unreachable, for the garbage collector, or each of their finalizers and the resource
tracker print a warning at exit (`tokenflow.runtime.run.resources.run_resources`)."""

from __future__ import annotations

from tests.probe_testlib import run_script

PROBE = """
import gc, multiprocessing as mp, sys
from pathlib import Path
from tokenflow.runtime.run.resources import leftovers, run_resources, run_tag
gc.disable()  # the cycle below waits for an explicit collection, as a large program's may
run = Path(sys.argv[1])

class Worker:  # a run's object in a reference cycle, holding a queue's semaphores
    pass

with run_resources(run):
    w = Worker()
    w.me, w.queue = w, mp.get_context("forkserver").Queue()  # named semaphores, as a run's (fork's are unlinked at once)
    made = len(leftovers(run_tag(run)))
del w
with run_resources(run):  # the same folder again: a resume
    pass
print("semaphores", made)
"""


def test_a_second_run_of_a_folder_in_one_process_leaves_no_warnings(tmp_path):
    done = run_script(PROBE, str(tmp_path), timeout=120)
    assert int(done.stdout.split()[-1]) >= 1  # the queue's semaphores carried the run's tag
    assert "resource_tracker" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
