"""The local sandbox's limits on a fake cgroup tree: what is written, the command prefix, the fallback."""

from __future__ import annotations

from sweflow.sandbox.limits import Limits, LimitSpec


def _v1(root):
    for ctl in ("pids", "memory"):
        (root / ctl).mkdir(parents=True)
        (root / ctl / "cgroup.procs").write_text("")
    return root


def test_v1_cgroups_are_made_and_the_prefix_enters_them(tmp_path):
    root = _v1(tmp_path / "cg")
    lim = Limits("local-abc", LimitSpec(pids=64, memory_mb=256, file_size_mb=16), cgroup_root=root)
    assert (lim.pids_capped, lim.memory_capped) == (True, True)
    assert (root / "pids/sweflow/local-abc/pids.max").read_text() == "64"
    assert (root / "memory/sweflow/local-abc/memory.limit_in_bytes").read_text() == str(256 * 2**20)
    argv = lim.prefix()
    assert argv[:3] == ["prlimit", "--core=0:0", f"--fsize={16 * 2**20}:{16 * 2**20}"]
    assert not any(a.startswith("--nproc") for a in argv), "a pids cgroup counts this sandbox alone"
    assert argv[argv.index("--") + 1 : argv.index("--") + 3] == ["/bin/sh", "-c"]
    assert str(root / "pids/sweflow/local-abc/cgroup.procs") in argv[argv.index("--") + 3]
    for f in (root / "pids/sweflow/local-abc").iterdir():  # a real cgroupfs folder goes with its files
        f.unlink()
    Limits.release("local-abc", mounts=[], cgroup_root=root)
    assert not (root / "pids/sweflow/local-abc").exists()
    assert (root / "memory/sweflow/local-abc").exists(), "a folder it cannot remove is left, with a warning"


def test_without_a_cgroup_hierarchy_rlimits_stand_alone(tmp_path):
    lim = Limits("local-x", LimitSpec(pids=100, memory_mb=512, file_size_mb=0), cgroup_root=tmp_path / "none")
    assert (lim.cgroups, lim.pids_capped, lim.memory_capped) == ([], False, False)
    assert lim.prefix() == ["prlimit", "--core=0:0", "--nproc=100:100", "--"]


def test_zero_turns_each_limit_off(tmp_path):
    root = _v1(tmp_path / "cg")
    lim = Limits("local-y", LimitSpec(pids=0, memory_mb=0, file_size_mb=0, scratch_mb=0), cgroup_root=root)
    assert lim.cgroups == [] and lim.prefix() == ["prlimit", "--core=0:0", "--"]
    assert lim.mount_scratch(tmp_path, 65534) is False
