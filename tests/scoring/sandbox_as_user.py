"""Run one attack as whatever user this process is (the suite starts it under
``setpriv --reuid=54321 ...``): a JSON request on stdin, the SandboxResult as JSON on stdout.

The Python running this may be the system one, without numpy: the ``tokenflow.scoring`` package
__init__ (which imports numpy) is skipped by registering a bare package for it."""

import json
import sys
import types
from pathlib import Path

if __name__ == "__main__":
    src = sys.argv[1]
    sys.path[:0] = [src, str(Path(__file__).parent)]
    pkg = types.ModuleType("tokenflow.scoring")
    pkg.__path__ = [f"{src}/tokenflow/scoring"]
    sys.modules["tokenflow.scoring"] = pkg
    import sandbox_bait

    request = json.load(sys.stdin)
    if request.get("probe"):
        from tokenflow.scoring.sandbox import probe_isolation
        iso = probe_isolation()
        print(json.dumps({"layers": list(iso.layers), "notes": list(iso.notes)}))
    else:
        print(json.dumps(sandbox_bait.run_attack(request["name"], request["params"], request["limits"],
                                                 "sandbox_as_user", request.get("mode"))))
