"""Finding where execution groups go (v1, v2, inside a container), and reading what limit was hit."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from atmosphere.sandbox.code.cgroups import CgroupHost, CgroupLimits, ExecCgroup, detect
from atmosphere.sandbox.code.seccomp import DENIED, build_filter, filter_for_machine

V1_MOUNTINFO = """\
30 24 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 /docker/abc {root}/pids rw,relatime - cgroup cgroup rw,pids
32 30 0:28 / {root}/memory rw,relatime - cgroup cgroup rw,memory
33 30 0:29 / {root}/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
"""
V1_CGROUP = "4:pids:/docker/abc/svc\n3:memory:/svc\n2:cpu,cpuacct:/\n1:name=systemd:/\n"


def test_v1_groups_go_under_the_services_own_groups(tmp_path: Path) -> None:
    for directory in ("pids/svc", "memory/svc", "cpu,cpuacct"):
        (tmp_path / directory).mkdir(parents=True)
    (tmp_path / "mountinfo").write_text(V1_MOUNTINFO.format(root=tmp_path))
    (tmp_path / "cgroup").write_text(V1_CGROUP)
    host = detect(tmp_path / "mountinfo", tmp_path / "cgroup")
    assert isinstance(host, CgroupHost)
    assert host.version == 1
    assert dict(host.parents) == {
        "pids": tmp_path / "pids" / "svc",  # the mount's root is the container's own group
        "memory": tmp_path / "memory" / "svc",
        "cpu": tmp_path / "cpu,cpuacct",
    }
    assert host.missing == ("freezer",)
    group = host.create(CgroupLimits(memory_bytes=1 << 20, pids=8, cpus=0.5))
    assert all(directory.is_dir() and directory.name.startswith("atmo-code-") for directory in group.dirs)
    group.remove_empty()
    assert not any(directory.exists() for directory in group.dirs)


def test_without_a_usable_hierarchy_the_reason_is_given(tmp_path: Path) -> None:
    (tmp_path / "mountinfo").write_text("30 24 0:26 / /proc rw - proc proc rw\n")
    (tmp_path / "cgroup").write_text("0::/\n")
    assert detect(tmp_path / "mountinfo", tmp_path / "cgroup") == "no cgroup hierarchy mounted"
    (tmp_path / "mountinfo").write_text(f"31 24 0:27 / {tmp_path}/nowhere rw - cgroup cgroup rw,pids,memory\n")
    reason = detect(tmp_path / "mountinfo", tmp_path / "cgroup")
    assert isinstance(reason, str)
    assert reason.startswith("cannot make cgroups")


def test_v2_enables_the_controllers_it_needs(tmp_path: Path) -> None:
    service = tmp_path / "unified" / "svc"
    service.mkdir(parents=True)
    (service / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (service / "cgroup.subtree_control").write_text("")
    (tmp_path / "mountinfo").write_text(f"29 24 0:25 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n")
    (tmp_path / "cgroup").write_text("0::/svc\n")
    host = detect(tmp_path / "mountinfo", tmp_path / "cgroup")
    assert isinstance(host, CgroupHost)
    assert (host.version, dict(host.parents), host.controllers) == (2, {"": service}, ("pids", "memory", "cpu"))
    assert (service / "cgroup.subtree_control").read_text() == "+cpu"  # the last one written (a file here)


def test_the_limit_hit_is_read_from_the_counters(tmp_path: Path) -> None:
    memory, pids = tmp_path / "memory", tmp_path / "pids"
    memory.mkdir()
    pids.mkdir()
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (pids / "pids.events").write_text("max 0\n")
    group = ExecCgroup(1, [pids, memory])
    assert group.limit_hit() is None
    (pids / "pids.events").write_text("max 12\n")
    assert group.limit_hit() == "pids"
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert group.limit_hit() == "memory"


def test_this_host_gives_pids_and_memory_groups() -> None:
    host = detect()
    if isinstance(host, str):  # not root, or no hierarchy: the sandbox says "rlimits only (...)"
        assert host
        return
    assert {"pids", "memory"} <= set(host.controllers)


def test_the_seccomp_filter_covers_both_machines() -> None:
    x86 = build_filter("x86_64")
    arm = build_filter("aarch64")
    assert len(x86) == 8 * (4 + 2 + 2 * len(DENIED) + 7)  # the x32 check only on x86-64
    assert len(arm) == 8 * (4 + 2 * len(DENIED) + 7)
    assert filter_for_machine("riscv64") is None


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_groups_left_by_a_dead_service_are_swept(tmp_path: Path) -> None:
    gone, parent = _dead_pid(), tmp_path / "pids"
    for name in (f"atmo-code-{gone}-1", f"atmo-code-{gone}-2", f"atmo-code-{os.getpid()}-1", "other"):
        (parent / name).mkdir(parents=True)
    assert CgroupHost(1, {"pids": parent}).sweep_stale() == 2
    assert sorted(p.name for p in parent.iterdir()) == sorted([f"atmo-code-{os.getpid()}-1", "other"])
