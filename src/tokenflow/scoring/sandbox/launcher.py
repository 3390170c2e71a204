"""The sandbox's exec wrapper: set up the work dir and limits, then hand the program to
bubblewrap (or, without it, to the hand-written layers of :mod:`hand_layers`).

Run by the parent as ``python -I -S -B launcher.py <config fd> <status fd>`` in a fresh session.
It imports nothing from tokenflow (its siblings kernel.py, syscall_filter.py and hand_layers.py
are imported by path, standard library only) and does its work in plain syscalls, not in
``preexec_fn`` (unsafe in a threaded parent)::

    launcher (host namespaces)
      ├─ join the run's pids cgroup                   -- if the parent made one
      ├─ unshare(mount [, user])                      -- a user namespace when not root
      ├─ tmpfs (size=, nr_inodes=) over the work dir  -- both quotas; gone with the namespace
      ├─ write the program's files into it, set rlimits
      └─ fork → [run uid] → execve bwrap … -- python -I -B main.py
                 private root, all namespaces, uid 65534, no capabilities, no_new_privs, seccomp
         (or hand_layers.run when bwrap is absent or refused)

The layers that took effect, then bwrap's exit status (the program's; 128 + N for signal N),
go to the status fd as JSON lines. bwrap does not close inherited descriptors, so the status fd
is closed before its exec: nothing but stdin/stdout/stderr and the seccomp memfd reach it.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import hand_layers  # noqa: E402  (by path: see above)
import kernel  # noqa: E402
import syscall_filter  # noqa: E402


def _read_config(fd: int) -> dict:
    with os.fdopen(fd, "rb") as f:
        return json.loads(f.read())


def _join_cgroup(cfg: dict, layers: list[str], notes: list[str]) -> None:
    """Into the run's cgroup(s): one directory per controller on v1, one for both on v2."""
    joined = {}
    for layer, path in sorted(cfg.get("cgroups", {}).items()):
        if path not in joined:
            try:
                with open(os.path.join(path, "cgroup.procs"), "w", encoding="ascii") as f:
                    f.write(str(os.getpid()))
                joined[path] = True
            except OSError as e:
                joined[path] = False
                notes.append(f"cgroup {path}: {e}")
        if joined[path]:
            layers.append(layer)


def _private_workdir(cfg: dict, bwrap: bool, layers: list[str], notes: list[str]) -> bool:
    """A mount namespace of our own with the quota'd tmpfs on the work dir. From root, bwrap
    makes its own user namespace (and with a run uid, runs as that uid: the interpreter's prefix
    is bound where that uid can reach it); from another uid, bwrap runs as root of ours; the
    hand-written path maps the program's uid 65534 here. True when this process now has its
    own mounts."""
    uid, gid = os.getuid(), os.getgid()
    root = uid == 0
    try:
        if root and bwrap:
            kernel.unshare(kernel.CLONE_NEWNS, "mount")
        else:
            try:
                kernel.unshare(kernel.CLONE_NEWNS | kernel.CLONE_NEWUSER, "mount, user")
                kernel.map_ids(0 if bwrap else 65534, uid, gid)
                layers.append("user_namespace")
            except OSError as e:
                if not root:
                    raise
                notes.append(f"user namespace refused ({e}); the program keeps uid 0")
                kernel.unshare(kernel.CLONE_NEWNS, "mount")
        kernel.make_mounts_private()
        for source, target in cfg.get("binds", []):
            kernel.bind_read_only(source, target)
    except OSError as e:
        notes.append(str(e))
        return False
    try:
        kernel.mount_tmpfs(cfg["workdir"], cfg["workdir_mb"], cfg["workdir_files"], cfg.get("run_uid"))
        layers.append("workdir_quota")
    except OSError as e:
        notes.append(str(e))
    return True


def _write_files(cfg: dict) -> None:
    """The parent checked the names (relative, no ``..``); files land only under the work dir."""
    for name, text in cfg["files"].items():
        path = os.path.join(cfg["workdir"], name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        if cfg.get("run_uid") is not None:
            os.chown(path, cfg["run_uid"], cfg["run_uid"])


def _run_bwrap(cfg: dict, filter_bytes: bytes | None, status_fd: int, layers: list[str],
               notes: list[str]) -> int:
    """Start bwrap, reap it and every orphan it leaves (this process is their subreaper, so
    none lingers as a zombie of init), and report bwrap's exit status."""
    argv = list(cfg["bwrap_argv"])
    seccomp_fd = None
    if filter_bytes:
        seccomp_fd = os.memfd_create("tokenflow-seccomp", 0)
        os.write(seccomp_fd, filter_bytes)
        os.lseek(seccomp_fd, 0, os.SEEK_SET)
        argv[1:1] = ["--seccomp", str(seccomp_fd)]
        layers.append("seccomp")
    # What bwrap sets up or fails on (it then exits 1, saying "bwrap: ..." on stderr):
    layers += ["network_namespace", "pid_namespace", "ipc_namespace", "private_proc", "private_root",
               "minimal_dev", "read_only_fs", "no_capabilities", "no_new_privs"]
    if os.getuid() == 0:
        layers.append("user_namespace")  # bwrap's own; non-root runs already listed ours
    if cfg.get("run_uid") is not None or cfg["caller_uid"] != 0:
        layers.append("unprivileged_uid")
    else:
        notes.append("the program's uid 65534 maps to root outside its user namespace")
    hand_layers.status(status_fd, layers=layers, notes=notes)
    kernel.set_child_subreaper()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(status_fd)
            if seccomp_fd is not None:
                os.set_inheritable(seccomp_fd, True)
            if cfg.get("run_uid") is not None:
                kernel.switch_user(cfg["run_uid"])  # a uid of its own: owns nothing on the host
            kernel.set_limits(cfg["limits"])
            os.execve(argv[0], argv, cfg["bwrap_env"])
        finally:
            os._exit(127)
    code = 1
    while True:
        try:
            done, st = os.wait()
        except ChildProcessError:
            break
        if done == pid:
            code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else 128 + os.WTERMSIG(st)
    hand_layers.status(status_fd, bwrap_exit=code)
    return 0


def main() -> int:
    cfg = _read_config(int(sys.argv[1]))
    status_fd = int(sys.argv[2])
    layers, notes = ["session", "rlimits", "scrubbed_env"], []
    _join_cgroup(cfg, layers, notes)
    try:
        filter_bytes = syscall_filter.build()
    except syscall_filter.UnsupportedArch as e:
        filter_bytes = None
        notes.append(str(e))
    bwrap = bool(cfg["namespaces"] and cfg.get("bwrap_argv"))
    own_mounts = cfg["namespaces"] and _private_workdir(cfg, bwrap, layers, notes)
    _write_files(cfg)
    if bwrap and own_mounts:
        return _run_bwrap(cfg, filter_bytes, status_fd, layers, notes)
    if bwrap:
        notes.append("bubblewrap not used: no mount namespace for the work dir")
    return hand_layers.run(cfg, status_fd, filter_bytes, layers, notes, own_mounts)


if __name__ == "__main__":
    sys.exit(main())
