"""`tokenflow engines add|remove|list --run RUN_DIR`: change the engines of a live run (Ray backend).

The command writes a request into the run folder (``tokenflow.runtime.run.control``) and waits
for the orchestrator's answer: a new engine is in once it holds the current weights, a removed
one is out once its in-flight groups went to the others and the weight sync no longer counts it.
"""

from __future__ import annotations

import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "engines", help="add or remove engines of a running Ray run, or list them",
        description="Add engines to a running run or remove some (Ray backend), or list them. A new engine "
                    "loads the current weights before it gets work; a removed engine's in-flight prompts go "
                    "to the others with the same seeds. The run keeps between runtime.min_engines and "
                    "runtime.max_engines.")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for action, text in (("add", "start engines and give them work once they hold the current weights"),
                         ("remove", "take engines out; their in-flight prompts go to the others"),
                         ("list", "the engines now, as the run last wrote them")):
        a = sub.add_parser(action, help=text, description=text)
        a.add_argument("--run", required=True, metavar="RUN_DIR", help="the live run's folder")
        if action != "list":
            a.add_argument("--count", type=int, default=1, help="how many (default 1)")
            a.add_argument("--wait", type=float, default=300.0, metavar="SECONDS",
                           help="how long to wait for the change to be done (default 300; 0: do not wait)")
        if action == "remove":
            a.add_argument("--engine", help="the engine to remove (default: the least loaded)")
        a.add_argument("--json", action="store_true", help="print the final reply (or the list) as JSON")
        a.set_defaults(func=run)


def run(args) -> int:
    from tokenflow.runtime.run.control import ControlError, read_status, submit, wait_reply

    if args.action == "list":
        status = read_status(args.run)
        if status is None:
            print(f"error: {args.run} has no engine status (is it a run folder of a live Ray run?)", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(status))
        else:
            for e in status["engines"]:
                state = "" if e["accepting"] else "  (joining)"
                print(f"{e['name']:<10} version {e['version']}  node {e['node']}{state}")
            if status.get("changing"):
                print(f"changing: {status['changing']}")
        return 0
    try:
        rid = submit(args.run, args.action, args.count, getattr(args, "engine", None))
    except ControlError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: cannot write the request into {args.run}: {e}", file=sys.stderr)
        return 2
    if args.wait <= 0:
        print(f"request {rid} placed")
        return 0
    show = None if args.json else (lambda reply: print(f"{reply['state']}: {reply['message']}"))
    reply = wait_reply(args.run, rid, args.wait, on_change=show)
    if args.json:
        print(json.dumps(reply))
    if reply is None:
        print(f"error: the run did not answer within {args.wait:g}s (it polls twice a second; is it still "
              "in its training window?)", file=sys.stderr)
        return 1
    if reply.get("state") != "done":
        if reply.get("state") != "failed":
            print(f"error: not done within {args.wait:g}s; the run goes on with it", file=sys.stderr)
        return 1
    return 0
