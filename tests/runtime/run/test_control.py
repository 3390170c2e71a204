"""The run folder's control channel (`tokenflow engines`): requests round-trip, and hostile files
in ``control/requests`` are answered with an error or removed, never followed or trusted."""

from __future__ import annotations

import json
import os
import threading

import pytest

from tests.runtime.runtime_testlib import small_config
from tokenflow.cli.main import build_parser
from tokenflow.runtime.run import control
from tokenflow.runtime.run.control import MAX_PER_POLL, ControlError, ControlInbox, submit
from tokenflow.runtime.run.resources import run_resources


def engines_cli(*argv: str) -> int:
    args = build_parser().parse_args(["engines", *argv])
    return args.func(args)


def place(inbox: ControlInbox, name: str, data: bytes) -> None:
    (inbox.requests / name).write_bytes(data)


RID = "0123456789abcdef0123456789abcdef"


def test_a_request_round_trips_while_the_run_holds_its_lock(tmp_path):
    with pytest.raises(ControlError, match="no tokenflow run is live"):
        submit(tmp_path, "add")
    with run_resources(tmp_path):
        inbox = ControlInbox(tmp_path)
        rid = submit(tmp_path, "remove", engine="engine3")
        (req,) = inbox.poll()
        assert (req.id, req.op, req.count, req.engine) == (rid, "remove", 1, "engine3")
        assert not any(inbox.requests.iterdir())  # read once, then gone
        assert inbox.poll() == []
        inbox.reply(rid, "done", "removed engine3")
        assert control.wait_reply(tmp_path, rid, 1.0) == {"state": "done", "message": "removed engine3"}
    assert not control.run_is_live(tmp_path)


@pytest.mark.parametrize("data, why", [
    (b"[1, 2]", "a JSON object, not list"),
    (b'{"op": "add", "count": true}', "count must be an integer"),
    (b'{"op": "add", "count": 17}', "count must be an integer from 1 to 16"),
    (b'{"op": "add", "count": NaN}', "UTF-8 JSON"),
    (b'{"op": "add", "count": 1e400}', "count must be an integer"),
    (b'{"op": "drop table"}', "op must be one of"),
    (b'{"op": "add", "cmd": "rm -rf /"}', "unknown field"),
    (b'{"op": "remove", "engine": "../../etc/passwd"}', "must be an engine's name"),
    (b'{"op": "add", "engine": "engine1"}', "an added engine gets a new name"),
    (b'{"op": "remove", "engine": "engine1", "count": 2}', "not both"),
    (b"\xff\xfe{}", "UTF-8 JSON"),
    (b"{" * 5000, "at most 4096 bytes"),
])
def test_a_bad_request_is_answered_with_what_is_wrong(tmp_path, data, why):
    inbox = ControlInbox(tmp_path)
    place(inbox, f"{RID}.json", data)
    assert inbox.poll() == []
    reply = control.read_reply(tmp_path, RID)
    assert reply["state"] == "failed" and why in reply["message"], reply
    assert not any(inbox.requests.iterdir())


def test_links_folders_and_foreign_names_are_not_followed(tmp_path):
    inbox = ControlInbox(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"op": "add"}))
    os.symlink(secret, inbox.requests / f"{RID}.json")  # a valid request, but through a link
    (inbox.requests / f"{'a' * 32}.json").mkdir()
    place(inbox, "not-an-id.json", b'{"op": "add"}')  # not a name submit() writes
    place(inbox, f".{RID}.json.1234.tmp", b'{"op": "add"}')  # a writer's temporary file
    os.mkfifo(inbox.requests / f"{'b' * 32}.json")  # would block a plain open()
    assert inbox.poll() == []
    assert "symlink" in control.read_reply(tmp_path, RID)["message"]
    assert "regular file" in control.read_reply(tmp_path, "b" * 32)["message"]
    assert secret.exists()  # the link went, not what it pointed at
    assert sorted(p.name for p in inbox.requests.iterdir()) == [f"{'a' * 32}.json"]  # a folder is left alone


def test_a_flood_is_read_a_few_requests_per_poll(tmp_path):
    inbox = ControlInbox(tmp_path)
    for i in range(MAX_PER_POLL * 2 + 3):
        place(inbox, f"{i:032x}.json", b'{"op": "add"}')
    assert [len(inbox.poll()) for _ in range(4)] == [MAX_PER_POLL, MAX_PER_POLL, 3, 0]


def test_stale_requests_of_an_earlier_invocation_are_dropped(tmp_path):
    first = ControlInbox(tmp_path)
    place(first, f"{RID}.json", b'{"op": "add"}')
    assert ControlInbox(tmp_path).poll() == []


def test_the_command_refuses_bad_input_before_writing(tmp_path, capsys):
    assert engines_cli("add", "--run", str(tmp_path), "--count", "0") == 2
    assert "count must be an integer from 1 to 16" in capsys.readouterr().err
    assert engines_cli("remove", "--run", str(tmp_path)) == 2
    assert "no tokenflow run is live" in capsys.readouterr().err
    assert engines_cli("list", "--run", str(tmp_path)) == 2
    assert not (tmp_path / "control").exists()


@pytest.mark.slow
def test_a_local_run_answers_that_engines_change_on_ray_only(tmp_path, capsys):
    from tokenflow.runtime.launch import train

    run = tmp_path / "run"
    got = {}

    def ask() -> None:
        for _ in range(600):
            if (run / "control" / "requests").is_dir() and control.run_is_live(run):
                got["rc"] = engines_cli("add", "--run", str(run), "--wait", "30")
                return
            threading.Event().wait(0.05)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    summary = train(small_config("--run.steps", "4", "--run.checkpoint_every", "0"), run)
    asker.join(timeout=30)
    assert got.get("rc") == 1 and summary["steps"] == 4
    assert 'on the Ray backend only (runtime.backend = "ray")' in capsys.readouterr().out
    assert summary["engines"] == {"added": [], "removed": [], "readmitted_groups": 0, "final": ["engine"]}
