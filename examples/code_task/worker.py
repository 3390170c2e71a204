"""Runs in the sandbox as ``main.py``: imports the model's ``solution.py`` and answers the calls
the reward asks for, one JSON line on stdin, one JSON line of results on stdout.

It judges nothing: which tests passed is decided by the reward, outside the sandbox, from these
results (plain values, see values.py). Whatever the model's code does in this process — read
this file's variables, print lines of its own, exit early, patch builtins — it can only change
the values its functions return, which is what it is scored on anyway.
"""

import json
import os
import sys

sys.path.insert(0, os.getcwd())  # python -I leaves the script's folder off sys.path
import values  # noqa: E402

calls = json.loads(sys.stdin.readline())
try:
    import solution
except BaseException as e:  # noqa: BLE001 - the model's module may raise anything
    print("RESULTS", json.dumps({"import_error": type(e).__name__}), flush=True)
    raise SystemExit(0)
results = []
for name, args, kwargs in calls:
    try:
        fn = getattr(solution, name)
        value = fn(*values.decode(args), **values.decode(kwargs))
        results.append({"value": values.encode(value)})
    except BaseException as e:  # noqa: BLE001 - a failing call fails the tests that made it
        results.append({"raise": type(e).__name__})
print("RESULTS", json.dumps({"results": results}), flush=True)
