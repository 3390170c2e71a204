"""The code sandbox against hostile programs: each is stopped or refused, the verdict names why,
the parent is unharmed and no process outlives the run.

Limits are set small so every test is bounded (pytest-timeout as a backstop). Tests that need a
containment layer (network or read-only file system) skip, saying so, where the kernel refuses
the namespaces; the probe test prints which layers this machine grants.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import psutil
import pytest

from tokenflow.scoring.sandbox import Sandbox, SandboxLimits, probe_isolation, run_program

pytestmark = pytest.mark.timeout(120)

SMALL = SandboxLimits(wall_s=5.0, cpu_s=2, memory_mb=512, file_mb=8, processes=16, output_bytes=64 << 10)


def leftovers(workdir: str) -> list[int]:
    """Processes whose working directory is (was) the run's work dir."""
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.cwd().startswith(workdir):
                found.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return found


def assert_clean(result) -> None:
    assert result.workdir
    time.sleep(0.2)  # killed tasks are freed asynchronously by the kernel
    assert leftovers(result.workdir) == []
    assert not os.path.exists(result.workdir)
    # The parent still works: it can start processes and run a program.
    assert run_program("print(6*7)", limits=SMALL).stdout.strip() == "42"


@pytest.fixture(scope="module")
def isolation():
    iso = probe_isolation()
    logging.getLogger(__name__).warning("sandbox isolation layers on this machine: %s (notes: %s)",
                                        ", ".join(iso.layers), "; ".join(iso.notes) or "none")
    return iso


def need(isolation, layer: str) -> None:
    if layer not in isolation.layers:
        pytest.skip(f"this kernel does not grant {layer} to the sandbox ({'; '.join(isolation.notes)})")


def test_a_well_behaved_program_runs_and_its_output_comes_back(isolation):
    r = run_program("import sys; print(sys.stdin.read().upper())", stdin="hello", limits=SMALL)
    assert r.ok and r.reason is None and r.exit_code == 0
    assert r.stdout.strip() == "HELLO"
    assert set(r.layers) == set(isolation.layers)
    assert {"session", "rlimits", "scrubbed_env"} <= set(r.layers)


@pytest.mark.slow
def test_fork_bomb_is_stopped_and_leaves_nothing_behind(isolation):
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_program(bomb, limits=SandboxLimits(wall_s=3.0, cpu_s=2, processes=16))
    assert not r.ok
    assert r.reason in ("timeout", "cpu_limit", "killed")
    assert_clean(r)


def test_ten_gigabyte_allocation_is_refused():
    r = run_program("x = bytearray(10 * 2**30)\nprint('allocated')", limits=SMALL)
    assert not r.ok and r.reason == "memory_limit"
    assert "allocated" not in r.stdout
    assert_clean(r)


@pytest.mark.slow
def test_infinite_loop_hits_the_cpu_limit():
    r = run_program("while True:\n    pass\n", limits=SandboxLimits(wall_s=20.0, cpu_s=1))
    assert not r.ok and r.reason == "cpu_limit"
    assert r.wall_s < 15
    assert_clean(r)


@pytest.mark.slow
def test_a_sleeping_program_is_killed_at_the_wall_clock():
    r = run_program("import time\ntime.sleep(60)", limits=SandboxLimits(wall_s=1.0))
    assert not r.ok and r.reason == "timeout"
    assert r.wall_s < 5
    assert_clean(r)


def test_one_gigabyte_file_write_is_stopped():
    code = "with open('big', 'wb') as f:\n    for _ in range(1024):\n        f.write(b'x' * 2**20)\nprint('wrote')"
    r = run_program(code, limits=SMALL)
    assert not r.ok and r.reason == "file_size_limit"
    assert "wrote" not in r.stdout
    assert_clean(r)


def test_output_flood_is_capped():
    r = run_program("while True:\n    print('y' * 1000)", limits=SMALL)
    assert not r.ok and r.reason == "output_limit"
    assert len(r.stdout) <= SMALL.output_bytes
    assert_clean(r)


def test_write_outside_the_work_dir_is_refused(isolation, tmp_path):
    need(isolation, "read_only_fs")
    target = tmp_path / "escaped.txt"
    r = run_program(f"open({str(target)!r}, 'w').write('out')\nprint('escaped')", limits=SMALL)
    assert not r.ok and r.reason == "exit_code_1"
    # read-only host tree (launcher's own layers), or not there at all (bubblewrap's private root)
    assert "Read-only file system" in r.stderr or "No such file or directory" in r.stderr
    assert not target.exists()
    assert_clean(r)


def test_environment_secrets_do_not_reach_the_program(monkeypatch):
    secret = "tf-secret-7f3a9c"
    monkeypatch.setenv("TOKENFLOW_TEST_SECRET", secret)
    code = ("import os, glob\nprint(dict(os.environ))\n"
            "for p in glob.glob('/proc/*/environ'):\n"
            "    try:\n        print(open(p, 'rb').read())\n    except OSError:\n        pass\n")
    r = run_program(code, limits=SMALL)
    assert r.ok
    assert "TMPDIR" in r.stdout  # the program did print its environment
    assert secret not in r.stdout and secret not in r.stderr


@pytest.mark.slow
def test_a_socket_to_the_parent_on_loopback_is_refused(isolation):
    need(isolation, "network_namespace")
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        code = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "s.sendall(b'leak')\nprint('connected')")
        r = run_program(code, limits=SMALL)
        assert not r.ok and r.reason == "exit_code_1"
        assert "connected" not in r.stdout
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()
    assert_clean(r)


def test_sandbox_reports_its_layers_and_warns_when_not_contained(caplog):
    with caplog.at_level(logging.WARNING):
        weak = Sandbox(SMALL, namespaces=False, cgroup=False)
    assert not weak.isolated
    assert "SANDBOX NOT CONTAINED" in caplog.text
    assert "network_namespace" in weak.isolation.missing
    r = weak.run("print('still runs')")
    assert r.ok and "network_namespace" not in r.layers


def test_without_bubblewrap_the_probe_names_the_private_root_and_how_to_install_it(caplog):
    with caplog.at_level(logging.WARNING):
        box = Sandbox(SMALL, bwrap=False)
    assert not box.isolated and box.isolation.mode == "hand"
    assert "private_root" in box.isolation.missing
    assert "SANDBOX NOT CONTAINED" in caplog.text and "apt-get install bubblewrap" in caplog.text
    assert box.run("print('still runs')").stdout.strip() == "still runs"


def test_the_seccomp_filter_refuses_what_the_issue_lists_and_checks_the_arch():
    from tokenflow.scoring.sandbox import syscall_filter

    required = {"mount", "umount2", "pivot_root", "setns", "unshare", "ptrace", "process_vm_readv",
                "process_vm_writev", "bpf", "keyctl", "open_by_handle_at", "kexec_load", "init_module",
                "finit_module", "delete_module"}
    assert required <= set(syscall_filter.DENIED_X86_64)
    prog = syscall_filter.build("x86_64")
    assert len(prog) % 8 == 0
    code, _, _, k = __import__("struct").unpack("=HBBI", prog[8:16])
    assert (code, k) == (syscall_filter.JEQ_K, syscall_filter.AUDIT_ARCH_X86_64)
    with pytest.raises(syscall_filter.UnsupportedArch):
        syscall_filter.build("aarch64")


def test_a_denied_syscall_fails_with_eperm_and_threads_still_start():
    code = ("import ctypes, errno, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "assert libc.unshare(0x10000000) == -1 and ctypes.get_errno() == errno.EPERM\n"
            "t = threading.Thread(target=print, args=('thread ran',)); t.start(); t.join()\n")
    r = run_program(code, limits=SMALL)
    assert r.ok, r.stderr
    assert "thread ran" in r.stdout
