"""A seccomp filter for sandboxed code: the kernel interfaces code has no business with answer EPERM.

The namespaces already leave the code nothing to attack with most of these; the filter is the
second line (and what makes `ptrace` of another sandbox process fail, which same-user processes
in one namespace could otherwise do): debugging other processes (`ptrace`, `process_vm_*`),
mounting and namespaces, keyrings, BPF, perf events, `userfaultfd` (a race-widening aid),
`io_uring`, kernel modules, `kexec`, `reboot`, swap, accounting, the kernel log, file handles
(`open_by_handle_at`, the "shocker" escape), and the terminal ioctls `TIOCSTI`/`TIOCLINUX`
(typing into a terminal, CVE-2017-5226). A foreign ABI (x32, or a 32-bit call on a 64-bit host)
kills the process: its numbers mean other calls.

The filter is classic BPF, built here (bwrap's `--seccomp FD` loads it), for x86-64 and aarch64;
other machines get none, and `filter_for_machine` says so.
"""

from __future__ import annotations

import errno
import platform
import struct
from typing import Final

_LD_W_ABS: Final = 0x20
_JEQ_K: Final = 0x15
_JGE_K: Final = 0x35
_RET_K: Final = 0x06
_RET_ALLOW: Final = 0x7FFF0000
_RET_ERRNO: Final = 0x00050000
_RET_KILL_PROCESS: Final = 0x80000000
_NR_OFFSET: Final = 0
_ARCH_OFFSET: Final = 4
_ARG1_LOW_OFFSET: Final = 24  # args[1], its low 32 bits (little-endian): an ioctl's request is 32 bits
_X32_BIT: Final = 0x40000000
TIOCSTI: Final = 0x5412
TIOCLINUX: Final = 0x541C

DENIED: Final = (
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "chroot",
    "unshare", "setns", "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "open_by_handle_at",
    "name_to_handle_at", "io_uring_setup", "io_uring_enter", "io_uring_register", "reboot", "swapon",
    "swapoff", "acct", "syslog", "kcmp", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount",
    "open_tree", "mount_setattr",
)  # fmt: skip
"""The system calls refused (EPERM)."""

# Numbers from <asm/unistd_64.h> (x86-64) and <asm-generic/unistd.h> (aarch64).
_X86_64: Final = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
    "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "keyctl": 250, "add_key": 248,
    "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "kexec_load": 246,
    "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "syslog": 103,
    "kcmp": 312, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429,
    "open_tree": 428, "mount_setattr": 442, "ioctl": 16,
}  # fmt: skip
_AARCH64: Final = {
    "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40, "umount2": 39,
    "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "keyctl": 219, "add_key": 217,
    "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "kexec_load": 104,
    "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
    "open_by_handle_at": 265, "name_to_handle_at": 264, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89, "syslog": 116,
    "kcmp": 272, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "move_mount": 429,
    "open_tree": 428, "mount_setattr": 442, "ioctl": 29,
}  # fmt: skip
_MACHINES: Final = {
    "x86_64": (0xC000003E, _X86_64, True),  # AUDIT_ARCH_X86_64; x32 calls share the arch value
    "aarch64": (0xC00000B7, _AARCH64, False),  # AUDIT_ARCH_AARCH64
}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def build_filter(machine: str) -> bytes:
    """The filter program (an array of `struct sock_filter`) for `machine` (`platform.machine()`).

    Raises:
        KeyError: no filter for `machine`.
    """
    arch, numbers, has_x32 = _MACHINES[machine]
    deny = _RET_ERRNO | errno.EPERM
    program = [
        _op(_LD_W_ABS, _ARCH_OFFSET),
        _op(_JEQ_K, arch, jt=1),
        _op(_RET_K, _RET_KILL_PROCESS),
        _op(_LD_W_ABS, _NR_OFFSET),
    ]
    if has_x32:
        program += [_op(_JGE_K, _X32_BIT, jf=1), _op(_RET_K, _RET_KILL_PROCESS)]
    for name in DENIED:
        program += [_op(_JEQ_K, numbers[name], jf=1), _op(_RET_K, deny)]
    program += [
        _op(_JEQ_K, numbers["ioctl"], jf=5),
        _op(_LD_W_ABS, _ARG1_LOW_OFFSET),
        _op(_JEQ_K, TIOCSTI, jt=2),
        _op(_JEQ_K, TIOCLINUX, jt=1),
        _op(_RET_K, _RET_ALLOW),
        _op(_RET_K, deny),
        _op(_RET_K, _RET_ALLOW),
    ]
    return b"".join(program)


def filter_for_machine(machine: str | None = None) -> bytes | None:
    """The filter for this machine (or `machine`), or None where we have none."""
    try:
        return build_filter(machine or platform.machine())
    except KeyError:
        return None
