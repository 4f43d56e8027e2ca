"""The seccomp program, run through a small classic-BPF interpreter for every ABI it covers.

The kernel only ever runs the host's half of the filter; this checks both halves (x86-64 and
arm64) the same way, instruction by instruction, against `struct seccomp_data` built here.
"""
from __future__ import annotations

import errno
import struct

import pytest

from executors import seccomp as sc

ARCHES = list(sc.NUMBERS)
I386 = 0x40000003


def _run(prog: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Evaluate the filter on one system call; returns the seccomp action."""
    args6 = (list(args) + [0] * 6)[:6]
    data = struct.pack("=iI Q 6Q", nr, arch, 0, *args6)
    ins = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
    acc, pc = 0, 0
    for _ in range(len(ins) + 1):  # classic BPF only jumps forward: at most one pass
        code, jt, jf, k = ins[pc]
        if code == sc.BPF_LD | sc.BPF_W | sc.BPF_ABS:
            acc = struct.unpack_from("=I", data, k)[0]
        elif code == sc.BPF_RET | sc.BPF_K:
            return k
        elif code == sc.BPF_JMP | sc.BPF_JA:
            pc += k
        elif code == sc.BPF_JMP | sc.BPF_JEQ | sc.BPF_K:
            pc += jt if acc == k else jf
        elif code == sc.BPF_JMP | sc.BPF_JGE | sc.BPF_K:
            pc += jt if acc >= k else jf
        elif code == sc.BPF_JMP | sc.BPF_JSET | sc.BPF_K:
            pc += jt if acc & k else jf
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1
    raise AssertionError("the program did not return")


@pytest.fixture(scope="module")
def prog() -> bytes:
    p = sc.build_filter()
    assert len(p) % 8 == 0 and len(p) // 8 < 4096  # BPF_MAXINSNS
    return p


@pytest.mark.parametrize("arch", ARCHES)
def test_denied_calls_fail_with_eperm(prog: bytes, arch: str) -> None:
    nrs, audit = sc.NUMBERS[arch], sc.AUDIT_ARCH[arch]
    for name in sc.DENIED:
        if name in nrs:
            assert _run(prog, nrs[name], audit) == sc.RET_ERRNO | errno.EPERM, (arch, name)
    assert _run(prog, nrs["clone3"], audit) == sc.RET_ERRNO | errno.ENOSYS


@pytest.mark.parametrize("arch", ARCHES)
def test_ordinary_calls_pass(prog: bytes, arch: str) -> None:
    nrs, audit = sc.NUMBERS[arch], sc.AUDIT_ARCH[arch]
    listed = set(nrs.values())
    for nr in (n for n in range(0, 300) if n not in listed):  # read, write, openat, mmap, ...
        assert _run(prog, nr, audit) == sc.RET_ALLOW, (arch, nr)
    fork_flags = 0x01200000 | 17  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
    assert _run(prog, nrs["clone"], audit, (fork_flags,)) == sc.RET_ALLOW
    assert _run(prog, nrs["ioctl"], audit, (1, 0x5401)) == sc.RET_ALLOW  # TCGETS


@pytest.mark.parametrize("arch", ARCHES)
def test_namespace_clone_and_terminal_injection_denied(prog: bytes, arch: str) -> None:
    nrs, audit = sc.NUMBERS[arch], sc.AUDIT_ARCH[arch]
    for flag in (0x00020000, 0x10000000, 0x20000000, 0x40000000):
        assert _run(prog, nrs["clone"], audit, (flag | 17,)) == sc.RET_ERRNO | errno.EPERM
    for req in (sc.TIOCSTI, sc.TIOCLINUX):
        assert _run(prog, nrs["ioctl"], audit, (0, req)) == sc.RET_ERRNO | errno.EPERM


def test_other_abis_are_killed(prog: bytes) -> None:
    assert _run(prog, 11, I386) == sc.RET_KILL_PROCESS  # execve of the i386 ABI on x86-64
    assert _run(prog, sc.X32_SYSCALL_BIT | 59, sc.AUDIT_ARCH_X86_64) == sc.RET_KILL_PROCESS


@pytest.mark.parametrize("arch", ARCHES)
def test_limits_and_scheduling_of_other_processes_are_denied(prog: bytes, arch: str) -> None:
    """prlimit, priorities, affinity, memory placement: on the caller (0) only, so no answer can
    change PID 1 or another answer; the kernel reads the low 32 bits of a pid."""
    nrs, audit = sc.NUMBERS[arch], sc.AUDIT_ARCH[arch]
    for name, args in sc.SELF_ONLY.items():
        ok = [args.get(i, 0) for i in range(3)]
        assert _run(prog, nrs[name], audit, tuple(ok)) == sc.RET_ALLOW, (arch, name)
        for i in args:
            high = list(ok)
            high[i] |= 2**32  # the same low word: the same process for the kernel
            assert _run(prog, nrs[name], audit, tuple(high)) == sc.RET_ALLOW, (arch, name)
            for other in (1, 2**32 + 1):  # pid 1; pid 1 with high bits set
                bad = list(ok)
                bad[i] = other if ok[i] != 1 else 0
                assert _run(prog, nrs[name], audit, tuple(bad)) == sc.RET_ERRNO | errno.EPERM, \
                    (arch, name, bad)


@pytest.mark.parametrize("arch", ARCHES)
def test_memfd_is_refused_only_without_a_memory_cgroup(arch: str) -> None:
    nrs, audit = sc.NUMBERS[arch], sc.AUDIT_ARCH[arch]
    assert _run(sc.build_filter(), nrs["memfd_create"], audit) == sc.RET_ALLOW
    assert _run(sc.build_filter(deny_memfd=True), nrs["memfd_create"], audit) == \
        sc.RET_ERRNO | errno.EPERM
    for name in ("shmget", "msgget", "semget", "mq_open"):  # refused either way
        assert _run(sc.build_filter(), nrs[name], audit) == sc.RET_ERRNO | errno.EPERM
