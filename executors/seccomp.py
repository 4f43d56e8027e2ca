"""The seccomp filter of the code sandbox, written as a classic BPF program.

The kernel runs a seccomp filter on every system call of the filtered process and its children;
the filter reads `struct seccomp_data` (nr at offset 0, arch at 4, args from 16, each 8 bytes,
low half first on little-endian machines) and returns an action. This module builds that program
as bytes: an array of `struct sock_filter {u16 code; u8 jt; u8 jf; u32 k}` that the sandbox runner
installs with `prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)` after `PR_SET_NO_NEW_PRIVS`.

Policy: a deny list on top of namespaces and rlimits. Denied calls fail with EPERM (so the
program sees an ordinary error and the result says how it ended) except `clone3`, which fails
with ENOSYS so that the C library falls back to `clone`, whose flags the filter can inspect:
a `clone` that asks for a new namespace is refused. Calls from any other ABI (i386 or x32 on
x86-64, arm32 on arm64) kill the process, since their numbers differ from the ones checked here.
The denied calls give kernel attack surface or ways out: debugging other processes (ptrace,
process_vm_*, pidfd_getfd, kcmp, process_madvise), mounting and namespaces, BPF, keyrings, perf,
kernel modules, kexec, userfaultfd, io_uring (its operations bypass seccomp), handles that escape
mounts (open_by_handle_at), reboot and swap, `execve` (the program is already running in the
interpreter; no binary needs to start), network sockets (`socket` for every family; a
`socketpair` stays allowed), terminal injection (TIOCSTI, TIOCLINUX ioctls), System V IPC and
POSIX message queues (state that would outlive one answer in the sandbox's IPC namespace, and
memory no rlimit counts) and secret memory.
Calls that act on another process of the same uid are allowed on the caller only (a pid or
`who` argument of 0): the limits, scheduling, priority and memory placement of the sandbox's
PID 1 and of other answers cannot be changed from inside (`prlimit` on PID 1 fails).
`memfd_create` is refused too where no cgroup caps the sandbox's memory (`deny_memfd`): its
files count against no rlimit, only against a memory cgroup.
"""
from __future__ import annotations

import errno
import platform
import struct

# BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h).
BPF_LD, BPF_JMP, BPF_RET = 0x00, 0x05, 0x06
BPF_W, BPF_ABS, BPF_K = 0x00, 0x20, 0x00
BPF_JA, BPF_JEQ, BPF_JGE, BPF_JSET = 0x00, 0x10, 0x30, 0x40
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

OFF_NR, OFF_ARCH, OFF_ARG0, OFF_ARG1 = 0, 4, 16, 24

# Every namespace flag `clone` accepts (CLONE_NEWTIME shares its bit with the exit signal there).
CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
    | 0x40000000
TIOCSTI, TIOCLINUX = 0x5412, 0x541C

DENIED = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
          "process_madvise", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsmount",
          "fsconfig", "fspick", "move_mount", "open_tree", "mount_setattr", "unshare", "setns",
          "bpf", "keyctl", "add_key", "request_key", "perf_event_open",
          "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
          "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "reboot", "swapon",
          "swapoff", "acct", "quotactl", "syslog", "vhangup", "iopl", "ioperm",
          "execve", "execveat", "socket",
          "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl",
          "semget", "semop", "semtimedop", "semctl", "mq_open", "memfd_secret")
# Allowed only with these arguments (index: value, the low 32 bits): on the caller itself.
SELF_ONLY: dict[str, dict[int, int]] = {
    "prlimit64": {0: 0}, "sched_setaffinity": {0: 0}, "sched_setscheduler": {0: 0},
    "sched_setparam": {0: 0}, "sched_setattr": {0: 0}, "migrate_pages": {0: 0},
    "move_pages": {0: 0},
    "setpriority": {0: 0, 1: 0},  # PRIO_PROCESS, who 0 (PRIO_USER 0 would reach PID 1)
    "ioprio_set": {0: 1, 1: 0},  # IOPRIO_WHO_PROCESS, who 0
}
MEMFD = ("memfd_create",)  # denied only where no cgroup caps the sandbox's memory

# Syscall numbers: x86-64 from asm/unistd_64.h, arm64 from asm-generic/unistd.h.
NUMBERS: dict[str, dict[str, int]] = {
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
               "pidfd_getfd": 438, "kcmp": 312, "process_madvise": 440, "mount": 165,
               "umount2": 166, "pivot_root": 155,
               "chroot": 161, "fsopen": 430, "fsmount": 432, "fsconfig": 431, "fspick": 433,
               "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "unshare": 272,
               "setns": 308, "bpf": 321, "keyctl": 250, "add_key": 248, "request_key": 249,
               "perf_event_open": 298, "init_module": 175, "finit_module": 313,
               "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
               "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
               "io_uring_register": 427, "open_by_handle_at": 304, "name_to_handle_at": 303,
               "lookup_dcookie": 212, "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163,
               "quotactl": 179, "syslog": 103, "vhangup": 153, "iopl": 172, "ioperm": 173,
               "execve": 59, "execveat": 322, "socket": 41,
               "shmget": 29, "shmat": 30, "shmdt": 67, "shmctl": 31, "msgget": 68, "msgsnd": 69,
               "msgrcv": 70, "msgctl": 71, "semget": 64, "semop": 65, "semtimedop": 220,
               "semctl": 66, "mq_open": 240, "memfd_secret": 447, "memfd_create": 319,
               "prlimit64": 302, "sched_setaffinity": 203, "sched_setscheduler": 144,
               "sched_setparam": 142, "sched_setattr": 314, "migrate_pages": 256,
               "move_pages": 279, "setpriority": 141, "ioprio_set": 251,
               "clone": 56, "clone3": 435, "ioctl": 16},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271,
                "pidfd_getfd": 438, "kcmp": 272, "process_madvise": 440, "mount": 40,
                "umount2": 39, "pivot_root": 41,
                "chroot": 51, "fsopen": 430, "fsmount": 432, "fsconfig": 431, "fspick": 433,
                "move_mount": 429, "open_tree": 428, "mount_setattr": 442, "unshare": 97,
                "setns": 268, "bpf": 280, "keyctl": 219, "add_key": 217, "request_key": 218,
                "perf_event_open": 241, "init_module": 105, "finit_module": 273,
                "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294,
                "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426,
                "io_uring_register": 427, "open_by_handle_at": 265, "name_to_handle_at": 264,
                "lookup_dcookie": 18, "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89,
                "quotactl": 60, "syslog": 116, "vhangup": 58,
                "execve": 221, "execveat": 281, "socket": 198,
                "shmget": 194, "shmat": 196, "shmdt": 197, "shmctl": 195, "msgget": 186,
                "msgsnd": 189, "msgrcv": 188, "msgctl": 187, "semget": 190, "semop": 193,
                "semtimedop": 192, "semctl": 191, "mq_open": 180, "memfd_secret": 447,
                "memfd_create": 279, "prlimit64": 261, "sched_setaffinity": 122,
                "sched_setscheduler": 119, "sched_setparam": 118, "sched_setattr": 274,
                "migrate_pages": 238, "move_pages": 239, "setpriority": 140, "ioprio_set": 30,
                "clone": 220, "clone3": 435, "ioctl": 29},
}
AUDIT_ARCH = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}


def _stmt(code: int, k: int) -> tuple[int, int, int, int]:
    return (code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> tuple[int, int, int, int]:
    return (code, jt, jf, k)


def _arch_block(arch: str, deny_memfd: bool) -> list[tuple[int, int, int, int]]:
    """The checks for one ABI; every path through it ends in a return."""
    nrs = NUMBERS[arch]
    eperm = RET_ERRNO | errno.EPERM
    prog = [_stmt(BPF_LD | BPF_W | BPF_ABS, OFF_NR)]
    if arch == "x86_64":  # the x32 ABI reaches the same entry with this bit set
        prog += [_jump(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 0, 1),
                 _stmt(BPF_RET | BPF_K, RET_KILL_PROCESS)]
    for name in DENIED + (MEMFD if deny_memfd else ()):
        if name in nrs:  # iopl and ioperm exist on x86 only
            prog += [_jump(BPF_JMP | BPF_JEQ | BPF_K, nrs[name], 0, 1), _stmt(BPF_RET | BPF_K, eperm)]
    for name, args in SELF_ONLY.items():
        prog += _only_with(nrs[name], args, eperm)
    prog += [_jump(BPF_JMP | BPF_JEQ | BPF_K, nrs["clone3"], 0, 1),
             _stmt(BPF_RET | BPF_K, RET_ERRNO | errno.ENOSYS)]
    # clone(flags, ...): refuse namespace flags (the low word of the first argument holds them).
    prog += [_jump(BPF_JMP | BPF_JEQ | BPF_K, nrs["clone"], 0, 4),
             _stmt(BPF_LD | BPF_W | BPF_ABS, OFF_ARG0),
             _jump(BPF_JMP | BPF_JSET | BPF_K, CLONE_NS_FLAGS, 0, 1),
             _stmt(BPF_RET | BPF_K, eperm),
             _stmt(BPF_RET | BPF_K, RET_ALLOW)]
    # ioctl(fd, request): no typing into a terminal's input queue.
    prog += [_jump(BPF_JMP | BPF_JEQ | BPF_K, nrs["ioctl"], 0, 5),
             _stmt(BPF_LD | BPF_W | BPF_ABS, OFF_ARG1),
             _jump(BPF_JMP | BPF_JEQ | BPF_K, TIOCSTI, 1, 0),
             _jump(BPF_JMP | BPF_JEQ | BPF_K, TIOCLINUX, 0, 1),
             _stmt(BPF_RET | BPF_K, eperm),
             _stmt(BPF_RET | BPF_K, RET_ALLOW)]
    prog.append(_stmt(BPF_RET | BPF_K, RET_ALLOW))
    return prog


def _only_with(nr: int, args: dict[int, int], deny: int) -> list[tuple[int, int, int, int]]:
    """Allow syscall `nr` only when each argument's low word has its value (else `deny`); the
    accumulator keeps the syscall number on every path that does not return."""
    checks: list[tuple[int, int, int, int]] = []
    left = 2 * len(args)  # instructions after each check up to the allow
    for i, value in sorted(args.items()):
        left -= 2
        checks += [_stmt(BPF_LD | BPF_W | BPF_ABS, OFF_ARG0 + 8 * i),
                   _jump(BPF_JMP | BPF_JEQ | BPF_K, value, 0, left + 1)]
    body = checks + [_stmt(BPF_RET | BPF_K, RET_ALLOW), _stmt(BPF_RET | BPF_K, deny)]
    return [_jump(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, len(body))] + body


def build_filter(arches: tuple[str, ...] = ("x86_64", "aarch64"),
                 deny_memfd: bool = False) -> bytes:
    """The filter as packed `sock_filter` entries (host byte order), for the given ABIs;
    `deny_memfd`: refuse `memfd_create` too (no cgroup caps the sandbox's memory)."""
    blocks = [_arch_block(a, deny_memfd) for a in arches]
    # Dispatch on the architecture: for each ABI a test and a long jump (BPF_JA's offset is 32
    # bits, unlike the 8-bit conditional offsets) to its block; any other ABI is killed.
    head_len = 1 + 2 * len(arches) + 1
    prog = [_stmt(BPF_LD | BPF_W | BPF_ABS, OFF_ARCH)]
    start = head_len
    for i, arch in enumerate(arches):
        pc_ja = 1 + 2 * i + 1
        prog += [_jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH[arch], 0, 1),
                 _stmt(BPF_JMP | BPF_JA, start - (pc_ja + 1))]
        start += len(blocks[i])
    prog.append(_stmt(BPF_RET | BPF_K, RET_KILL_PROCESS))
    for block in blocks:
        prog += block
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def host_arch() -> str | None:
    """The ABI name of this machine when the filter knows it, else None."""
    m = platform.machine()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(m.lower(), m)
    return arch if arch in NUMBERS else None
