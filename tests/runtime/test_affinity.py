"""The binding plan and the topology readers, against fake sysfs trees built on disk."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.runtime.affinity import AffinityError, parse_mode, plan_binding, split_evenly
from orchestrator.runtime.topology import (
    TopologyError,
    detect_vendor,
    format_cpulist,
    list_devices,
    parse_cpulist,
    read_allowed_cpus,
    read_cores,
    read_topology,
)

from .fakesysfs import FakeSysfs, two_socket_8gpu

NODE0 = frozenset(range(0, 16)) | frozenset(range(32, 48))
NODE1 = frozenset(range(16, 32)) | frozenset(range(48, 64))


def assert_disjoint(sets):
    for a, b in itertools.combinations(sets, 2):
        assert not (a & b), (format_cpulist(a), format_cpulist(b))


def cpu_sets(plan):
    return [r.cpus for r in plan.ranks]


# ---------------------------------------------------------------- cpulists

def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert format_cpulist({11, 0, 1, 2, 3, 8, 10}) == "0-3,8,10-11"
    assert parse_cpulist("") == frozenset()
    for bad in ("a-b", "3-1", "-2"):
        with pytest.raises(TopologyError, match="bad CPU list"):
            parse_cpulist(bad)


# ---------------------------------------------------------------- readers

def test_topology_two_sockets_eight_devices(tmp_path):
    two_socket_8gpu(tmp_path)
    topo = read_topology("cuda", str(tmp_path), env={})
    # Sorted by BDF; the audio function and the NVSwitch bridge are not accelerators.
    assert [d.bdf for d in topo.devices] == [
        "0000:0a:00.0", "0000:18:00.0", "0000:2a:00.0", "0000:3b:00.0",
        "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:ca:00.0",
    ]
    assert [d.numa_node for d in topo.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo.node_cpus == {0: NODE0, 1: NODE1}
    assert topo.allowed == frozenset(range(64))
    assert len(topo.cores) == 32 and frozenset({0, 32}) in topo.cores
    assert topo.device_source == "pci"


def test_vendor_filter_and_detection(tmp_path):
    two_socket_8gpu(tmp_path, vendor=0x1ED5)  # Moore Threads
    assert list_devices("cuda", str(tmp_path), env={})[0] == ()
    assert len(list_devices("musa", str(tmp_path), env={})[0]) == 8
    assert len(list_devices("mthreads", str(tmp_path), env={})[0]) == 8  # alias
    assert detect_vendor(str(tmp_path)) == "musa"
    assert read_topology("auto", str(tmp_path), env={}).vendor == "musa"
    with pytest.raises(TopologyError, match="unknown vendor 'tpu'"):
        read_topology("tpu", str(tmp_path))


def test_nvidia_proc_listing_wins_over_host_pci(tmp_path):
    # In a container given 2 of the host's 8 GPUs, sysfs still lists all 8; /proc lists 2.
    fs = two_socket_8gpu(tmp_path)
    fs.nvidia_proc("0000:9a:00.0").nvidia_proc("0000:ab:00.0")
    devices, source = list_devices("cuda", str(tmp_path), env={})
    assert source == "nvidia-proc"
    assert [(d.bdf, d.numa_node) for d in devices] == [("0000:9a:00.0", 1), ("0000:ab:00.0", 1)]


def test_drm_listing_and_visible_devices(tmp_path):
    fs = FakeSysfs(tmp_path).cpus(8)
    fs.node(0, range(4)).node(1, range(4, 8))
    fs.pci("0000:c1:00.0", 0x1002, 0x038000, 1, drm_card=1)   # AMD Instinct: class 0x0380
    fs.pci("0000:41:00.0", 0x1002, 0x038000, 0, drm_card=0)
    fs.pci("0000:42:00.0", 0x1002, 0x030000, 0)               # no drm card: not listed by drm
    devices, source = list_devices("rocm", str(tmp_path), env={})
    assert source == "drm" and [d.bdf for d in devices] == ["0000:41:00.0", "0000:c1:00.0"]
    devices, _ = list_devices("rocm", str(tmp_path), env={"HIP_VISIBLE_DEVICES": "1"})
    assert [d.bdf for d in devices] == ["0000:c1:00.0"]


def test_allowed_cpus_from_cgroup_v2_and_v1(tmp_path):
    v2 = FakeSysfs(tmp_path / "v2").cpus(16).cgroup_v2(range(4, 8))
    v1 = FakeSysfs(tmp_path / "v1").cpus(16).cgroup_v1([1, 3])
    none = FakeSysfs(tmp_path / "none").cpus(16)
    assert read_allowed_cpus(str(v2.root)) == frozenset(range(4, 8))
    assert read_allowed_cpus(str(v1.root)) == {1, 3}
    assert read_allowed_cpus(str(none.root)) == frozenset(range(16))


def test_real_machine_allowed_cpus_is_sched_getaffinity():
    import os

    assert read_allowed_cpus("/") == frozenset(os.sched_getaffinity(0))
    assert read_cores("/")  # the real sysfs parses


# ---------------------------------------------------------------- plans

@pytest.fixture
def big(tmp_path):
    two_socket_8gpu(tmp_path)
    return read_topology("cuda", str(tmp_path), env={})


def test_numa_mode_gives_each_rank_its_devices_node(big):
    plan = plan_binding(big, 8, "numa")
    assert plan.mode == "numa"
    assert cpu_sets(plan) == [NODE0] * 4 + [NODE1] * 4
    assert [r.numa_node for r in plan.ranks] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_exclusive_mode_splits_each_node_keeping_siblings(big):
    plan = plan_binding(big, 8, "exclusive")
    sets = cpu_sets(plan)
    assert plan.mode == "exclusive"
    assert_disjoint(sets)
    assert all(len(s) == 8 for s in sets)
    assert all(s <= NODE0 for s in sets[:4]) and all(s <= NODE1 for s in sets[4:])
    assert sets[0] == frozenset({0, 1, 2, 3, 32, 33, 34, 35})  # whole cores: thread + sibling
    for s in sets:
        for cpu in s:
            assert (cpu + 32) % 64 in s  # no core is split between two ranks


def test_exclusive_with_four_ranks_uses_first_four_devices(big):
    plan = plan_binding(big, 4, "exclusive")
    sets = cpu_sets(plan)
    assert_disjoint(sets)
    assert frozenset().union(*sets) == NODE0  # all four devices are on node 0


def test_restricted_cpuset_is_always_intersected(tmp_path):
    fs = two_socket_8gpu(tmp_path)
    fs.cgroup_v2(list(range(8, 16)) + list(range(16, 24)))  # a pod's 16 exclusive CPUs
    topo = read_topology("cuda", str(tmp_path), env={})
    numa = plan_binding(topo, 8, "numa")
    assert cpu_sets(numa) == [frozenset(range(8, 16))] * 4 + [frozenset(range(16, 24))] * 4
    excl = plan_binding(topo, 8, "exclusive")
    assert_disjoint(cpu_sets(excl))
    assert all(len(s) == 2 for s in cpu_sets(excl))  # no siblings allowed: split threads
    assert all(s <= topo.allowed for s in cpu_sets(excl))


def test_cpuset_excluding_a_node_falls_back_to_even_split_and_says_so(tmp_path):
    two_socket_8gpu(tmp_path).cgroup_v2(range(0, 8))  # only node 0 CPUs
    topo = read_topology("cuda", str(tmp_path), env={})
    plan = plan_binding(topo, 8, "numa")
    assert plan.mode == "even" and plan.requested == "numa"
    assert cpu_sets(plan) == [frozenset({i}) for i in range(8)]
    assert any("exclude NUMA node(s) 1" in n for n in plan.notes)


def test_numa_node_minus_one_falls_back_to_even_split(tmp_path):
    fs = FakeSysfs(tmp_path).cpus(16, smt=True)
    fs.node(0, range(16))
    for i in range(4):
        fs.pci(f"0000:0{i + 1}:00.0", 0x19E5, 0x120000, -1)  # Ascend, no NUMA info
    topo = read_topology("ascend", str(tmp_path), env={})
    for mode in ("numa", "exclusive"):
        plan = plan_binding(topo, 4, mode)
        assert plan.mode == "even"
        assert any("numa_node=-1" in n for n in plan.notes)
        sets = cpu_sets(plan)
        assert_disjoint(sets)
        assert frozenset().union(*sets) == frozenset(range(16))
        assert sets[0] == {0, 1, 8, 9}  # two whole cores


def test_cpu_vendor_and_no_devices_fall_back(tmp_path):
    FakeSysfs(tmp_path).cpus(6).node(0, range(6))
    for vendor in ("cpu", "cuda"):
        plan = plan_binding(read_topology(vendor, str(tmp_path), env={}), 3, "numa")
        assert plan.mode == "even"
        assert cpu_sets(plan) == [{0, 1}, {2, 3}, {4, 5}]


def test_more_ranks_than_cores_is_a_clear_error(tmp_path):
    FakeSysfs(tmp_path).cpus(4).node(0, range(4))
    topo = read_topology("cpu", str(tmp_path), env={})
    with pytest.raises(AffinityError) as info:
        plan_binding(topo, 5, "exclusive")
    text = str(info.value)
    assert "5 ranks but only 4 allowed CPUs" in text
    assert "lower nproc_per_node or raise the cpu request" in text
    # mode none never needs CPUs of its own
    assert len(plan_binding(topo, 5, "none").ranks) == 5


def test_more_ranks_than_node_cpus_falls_back_before_erroring(tmp_path):
    two_socket_8gpu(tmp_path).cgroup_v2([0, 1, 2, 16, 17, 18, 19, 20])  # node 0: 3 CPUs, 4 ranks
    topo = read_topology("cuda", str(tmp_path), env={})
    plan = plan_binding(topo, 8, "exclusive")
    assert plan.mode == "even"
    assert any("node 0 has 4 ranks but only 3" in n for n in plan.notes)
    assert cpu_sets(plan) == [frozenset({c}) for c in sorted(topo.allowed)]


def test_none_mode_leaves_every_rank_on_all_allowed(big):
    plan = plan_binding(big, 8, "none")
    assert plan.mode == "none" and cpu_sets(plan) == [frozenset(range(64))] * 8


def test_explicit_map_valid_and_invalid(big):
    plan = plan_binding(big, 2, '{"0": "0-15", "1": "16-31"}')
    assert plan.mode == "map" and cpu_sets(plan) == [frozenset(range(16)), frozenset(range(16, 32))]
    assert [r.numa_node for r in plan.ranks] == [0, 1]
    shared = plan_binding(big, 2, {0: "0-3", 1: [3, 4]})
    assert any("share CPUs 3" in n for n in shared.notes)
    cases = {
        '{"0": "0-15"}': "no CPU list for local rank(s) 1",
        '{"0": "0-15", "1": "60-70"}': "local rank 1 asks for CPUs 64-70, outside the allowed CPUs 0-63",
        '{"0": "0-1", "1": "2", "2": "3"}': "names local rank(s) 2 but there are only 2 ranks",
        '{"zero": "0"}': "key 'zero' is not a local rank",
        '{"0": "x", "1": "1"}': "local rank 0: bad CPU list 'x'",
        '{"0": "", "1": "1"}': "local rank 0 is empty",
        '{"0": ': "not valid JSON",
        "fastest": "'fastest' is not a mode",
    }
    for spec, message in cases.items():
        with pytest.raises(AffinityError, match=None) as info:
            plan_binding(big, 2, spec)
        assert message in str(info.value), (spec, str(info.value))


def test_parse_mode_defaults_to_numa():
    assert parse_mode(None) == "numa" and parse_mode(" Exclusive ") == "exclusive"


def test_split_evenly_properties():
    cores = tuple(frozenset({i, i + 8}) for i in range(8))
    for n in range(1, 17):
        sets = split_evenly(range(16), n, cores)
        assert_disjoint(sets)
        assert frozenset().union(*sets) == frozenset(range(16))
        sizes = [len(s) for s in sets]
        assert max(sizes) - min(sizes) <= 2  # whole cores of 2 threads: at most one core apart
        if n <= 8:
            assert all((c + 8) % 16 in s for s in sets for c in s)
    with pytest.raises(AffinityError):
        split_evenly(range(16), 17, cores)


# ---------------------------------------------------------------- threads and sharing


def test_numa_ranks_sharing_a_node_split_its_threads(big):
    numa = plan_binding(big, 8, "numa")
    # 4 ranks on each 32-CPU node: 8 OpenMP threads each, not 32 (4x oversubscribed)
    assert [r.threads for r in numa.ranks] == [8] * 8
    assert numa.notes == ()
    excl = plan_binding(big, 8, "exclusive")
    assert [r.threads for r in excl.ranks] == [len(r.cpus) for r in excl.ranks] == [8] * 8
    assert [r["threads"] for r in numa.to_dict()["ranks"]] == [8] * 8


def test_numa_ranks_outnumbering_cpus_share_with_a_note_not_an_error(tmp_path):
    two_socket_8gpu(tmp_path).cgroup_v2([0, 1, 16, 17])   # 8 ranks on 4 CPUs
    topo = read_topology("cuda", str(tmp_path), env={})
    plan = plan_binding(topo, 8, "numa")
    assert plan.mode == "numa"
    assert cpu_sets(plan) == [frozenset({0, 1})] * 4 + [frozenset({16, 17})] * 4
    assert [r.threads for r in plan.ranks] == [1] * 8
    assert any("NUMA node 0: 4 ranks share 2 allowed CPU(s) (0-1)" in n for n in plan.notes)
    assert any("NUMA node 1: 4 ranks share 2" in n for n in plan.notes)
    with pytest.raises(AffinityError, match="ranks but only"):
        plan_binding(topo, 8, "exclusive")


def test_even_fallback_shares_cpus_outside_exclusive_mode(tmp_path):
    FakeSysfs(tmp_path).cpus(4).node(0, range(4))
    topo = read_topology("cpu", str(tmp_path), env={})
    plan = plan_binding(topo, 6, "numa")
    assert plan.mode == "even"
    sets = cpu_sets(plan)
    assert frozenset().union(*sets) == frozenset(range(4))
    assert all(len(s) == 1 for s in sets) and sets == sorted(sets, key=min)
    assert [r.threads for r in plan.ranks] == [1] * 6
    assert any("6 ranks but only 4 allowed CPUs" in n and "share" in n for n in plan.notes)
    # enough CPUs: no note about sharing, threads = the set's size
    plan = plan_binding(topo, 2, "numa")
    assert [r.threads for r in plan.ranks] == [2, 2]
    assert not any("share" in n for n in plan.notes)


def test_map_mode_threads_count_overlapping_ranks(tmp_path):
    FakeSysfs(tmp_path).cpus(8).node(0, range(8))
    topo = read_topology("cpu", str(tmp_path), env={})
    plan = plan_binding(topo, 3, '{"0": "0-3", "1": "0-3", "2": "4-7"}')
    assert [r.threads for r in plan.ranks] == [2, 2, 4]
