"""Which isolation layers this machine grants, probed once per process: a program run in the
sandbox observes itself (capabilities, seccomp mode, uid, visible processes, network interfaces,
file tree, work-dir quota), and a layer the launcher claimed but the program did not observe is
dropped with a note. When bubblewrap is present but refuses to start, the probe runs again
without it, and says why."""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass

from tokenflow.scoring.sandbox import bwrap as bubblewrap
from tokenflow.scoring.sandbox.result import SandboxResult
from tokenflow.scoring.sandbox.runner import SandboxLimits, run_in_mode

log = logging.getLogger(__name__)

# Every one of these must hold for a hostile program to be contained; a missing one is named,
# with how to get it, in the warning ``Sandbox()`` logs.
CONTAINMENT = ("network_namespace", "pid_namespace", "ipc_namespace", "private_proc", "read_only_fs",
               "minimal_dev", "private_root", "unprivileged_uid", "no_capabilities", "no_new_privs",
               "seccomp", "workdir_quota")
_NAMESPACES_HINT = ("the kernel refused namespaces: run as root, or allow unprivileged user namespaces "
                    "(sysctl -w kernel.unprivileged_userns_clone=1 user.max_user_namespaces=15000; "
                    "Ubuntu 24.04+: kernel.apparmor_restrict_unprivileged_userns=0)")
HINTS = {
    "private_root": bubblewrap.INSTALL_HINT,
    "seccomp": "a seccomp filter needs x86_64 and a kernel with CONFIG_SECCOMP_FILTER",
    "cgroup_pids": ("run as root with the pids controller mounted, or delegate a cgroup "
                    "(systemd-run --user --scope -p Delegate=yes ...); until then RLIMIT_NPROC "
                    "and the pid namespace cap processes"),
    "cgroup_memory": ("run as root with the memory controller mounted, or delegate a cgroup "
                      "(systemd-run --user --scope -p Delegate=yes ...); until then only RLIMIT_AS "
                      "bounds memory, per process"),
    **{layer: _NAMESPACES_HINT for layer in ("network_namespace", "pid_namespace", "ipc_namespace",
                                             "private_proc", "minimal_dev", "read_only_fs",
                                             "workdir_quota")},
    **{layer: f"{bubblewrap.INSTALL_HINT}, or allow user namespaces"
       for layer in ("unprivileged_uid", "no_capabilities", "no_new_privs")},
}


@dataclass(frozen=True)
class Isolation:
    layers: tuple[str, ...]
    notes: tuple[str, ...]
    mode: str = "hand"
    """How runs are isolated here (:data:`runner.MODES`): the strongest that ran the probe."""

    @property
    def bwrap(self) -> bool:
        """Runs go through bubblewrap."""
        return self.mode != "hand"

    @property
    def contained(self) -> bool:
        """Every layer of :data:`CONTAINMENT` took effect."""
        return all(layer in self.layers for layer in CONTAINMENT)

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(layer for layer in CONTAINMENT + ("cgroup_pids", "cgroup_memory")
                     if layer not in self.layers)

    def report(self) -> str:
        """The missing layers, grouped by how to get them."""
        groups: dict[str, list[str]] = {}
        for layer in self.missing:
            groups.setdefault(HINTS[layer], []).append(layer)
        return "; ".join(f"{', '.join(layers)} (how: {hint})" for hint, layers in groups.items())


# Run inside the sandbox: what the program can see of its own confinement.
PROBE = r"""import json, os, socket
status = dict(l.split(":\t", 1) for l in open("/proc/self/status") if ":\t" in l)
def writable(path):
    return os.access(path, os.W_OK)  # EROFS counts: access(2) checks the mount too
st = os.statvfs(".")
print(json.dumps({"cap": [int(status[k], 16) for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb")],
    "no_new_privs": status.get("NoNewPrivs", "0").strip(), "seccomp": status.get("Seccomp", "0").strip(),
    "uid": os.getuid(), "pids": sum(p.isdigit() for p in os.listdir("/proc")),
    "interfaces": [n for _, n in socket.if_nameindex()], "host_tree": os.path.isdir("/etc") or os.path.isdir("/var"),
    "root_writable": writable("/") or writable("/usr"), "inodes": st.f_files,
    "ipc_ns": os.readlink("/proc/self/ns/ipc"),
    "devices": sorted(n for n in os.listdir("/dev") if not os.path.islink("/dev/" + n)
                      and not os.path.isdir("/dev/" + n))}))
"""


# bubblewrap's --dev also binds the host's /dev/tty (which opens only a controlling terminal,
# and a run has none: it is in a session of its own).
_DEV_ALLOWED = {"null", "zero", "full", "random", "urandom", "tty"}


def _observed(claimed: list[str], seen: dict, limits) -> tuple[list[str], list[str]]:
    checks = {
        "no_capabilities": not any(seen["cap"]),
        "no_new_privs": seen["no_new_privs"] == "1",
        "seccomp": seen["seccomp"] == "2",
        "unprivileged_uid": seen["uid"] != 0,
        "pid_namespace": seen["pids"] <= 8,
        "private_proc": seen["pids"] <= 8,
        "network_namespace": set(seen["interfaces"]) <= {"lo"},
        "private_root": not seen["host_tree"],
        "read_only_fs": not seen["root_writable"],
        "workdir_quota": 0 < seen["inodes"] <= limits.workdir_files,
        "ipc_namespace": seen["ipc_ns"] != os.readlink("/proc/self/ns/ipc"),
        "minimal_dev": set(seen["devices"]) <= _DEV_ALLOWED,
    }
    layers = [layer for layer in claimed if checks.get(layer, True)]
    notes = [f"{layer} was set up but the program did not observe it ({json.dumps(seen)})"
             for layer in claimed if not checks.get(layer, True)]
    return layers, notes


@functools.lru_cache(maxsize=8)
def probe_isolation(namespaces: bool = True, cgroup: bool = True, bwrap: bool = True) -> Isolation:
    """Run the probe program in the sandbox, in the strongest mode that starts, and report the
    layers that took effect (and, in ``notes``, why any did not)."""
    notes: list[str] = []
    modes = ["hand"]
    if namespaces and bwrap:
        if bubblewrap.find():
            modes = (["bwrap_uid"] if os.getuid() == 0 else []) + ["bwrap", "hand"]
        else:
            notes.append(f"bubblewrap (bwrap) not found, so no private root: {bubblewrap.INSTALL_HINT}")
    limits = SandboxLimits(wall_s=30)
    for mode in modes:
        result = run_in_mode(PROBE, mode, limits=limits, namespaces=namespaces, cgroup=cgroup)
        if result.ok:
            break
        notes.append(f"mode {mode} could not run the probe ({result.reason}: "
                     f"{(result.stderr.strip() or '; '.join(result.notes))[-300:]})")
    else:
        raise RuntimeError(f"the sandbox cannot run even the probe: {' | '.join(notes)}")
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    layers, seen_notes = _observed(list(result.layers), seen, limits)
    return Isolation(tuple(layers), tuple(notes + list(result.notes) + seen_notes), mode=mode)


def run_program(code: str, *, stdin: str = "", files: dict[str, str] | None = None,
                limits: SandboxLimits = SandboxLimits(), namespaces: bool = True,
                cgroup: bool = True, bwrap: bool = True) -> SandboxResult:
    """Run ``code`` as ``main.py`` in a fresh work dir holding ``files``; see the module doc.
    The isolation is the strongest mode the (cached) probe found working here; ``bwrap=False``
    keeps to the launcher's own layers."""
    mode = "hand"
    if namespaces and bwrap and bubblewrap.find():
        mode = probe_isolation(namespaces, cgroup, True).mode
    return run_in_mode(code, mode, stdin=stdin, files=files, limits=limits, namespaces=namespaces,
                       cgroup=cgroup)
