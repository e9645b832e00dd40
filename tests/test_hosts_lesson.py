"""Notebook 28 ("Two machines") and `./kit bench --hosts`'s section on network hosts
(tests/hosts/netns.py), h2's link shaped to 100 Mbit/s meanwhile. Its own hosts, apart from
tests/test_hosts.py's, so both run at once. What the hosts are and what a test leaves behind:
tests/test_hosts.py."""

from __future__ import annotations

import pytest
from support import bench_module
from test_hosts import nothing_left, run_lesson

pytestmark = [pytest.mark.torchrun, pytest.mark.slow]


def test_the_two_machines_lesson_runs_on_two_hosts_across_a_shaped_link(net, tmp_path):
    """Notebook 28 with DDP_KIT_HOSTS=h1,h2, h2's link shaped to 100 Mbit/s: its cells' own
    assertions hold on real hosts, across the link busbw is the link's rate (less TCP's
    overhead), and within h1 it is many times that."""
    said = run_lesson(net, tmp_path, {"DDP_KIT_HOSTS": "h1,h2"}, [])
    assert said["machines"] == "2 hosts, h1, h2, started over ssh (DDP_KIT_HOSTS)."
    assert said["hosts"] == ["h1", "h1", "h2", "h2"]
    assert [e["GLOO_SOCKET_IFNAME"] for e in said["env"]] == ["veth-h1"] * 2 + ["veth-h2"] * 2
    assert [line[1] for line in said["commands"]] == ["--rdzv-backend=c10d"] * 2
    assert [line[3] for line in said["commands"]] == ["--rdzv-conf=is_host=1,join_timeout=300",
                                                      "--rdzv-conf=is_host=0,join_timeout=300"]
    rate = 100e6 / 8  # bytes/s
    across, within = said["busbw"]["across the nodes"], said["busbw"]["within a node"]
    assert 0.5 * rate < across < 1.05 * rate  # 5 %: tbf's burst of 64 kB at line rate
    assert within > 5 * across
    assert said["failed"] == [0, 1] and said["lost_hosts"] == ["h1", "h1", "h2", "h2"]
    assert said["notes"] == ["Host h2's agent was killed by SIGKILL, not by the kit: its ranks "
                             "ended with it and left no report, as when a machine goes down."]
    assert nothing_left(net) == {}


def test_the_benchmark_sets_two_hosts_against_one_and_the_link_against_its_rate(net):
    """./kit bench --hosts's section, on this module's hosts: a trivial job and a DDP step as
    a live cell on 2 hosts x 2 ranks against 4 ranks on one host, and busbw across h2's link
    shaped to 100 Mbit/s."""
    measured = bench_module().across_hosts(net, "100mbit", 1, [1 << 10, 4 << 20])
    assert measured["two_hosts_s"] > 0 and measured["one_host_s"] > 0
    assert measured["ratio"] == measured["two_hosts_s"] / measured["one_host_s"]
    assert measured["two_hosts_step_s"] > 0 and measured["one_host_step_s"] > 0
    assert measured["step_ratio"] == measured["two_hosts_step_s"] / measured["one_host_step_s"]
    assert measured["link_rate"] == 100e6 / 8
    assert 0.5 < measured["across_to_rate"] < 1.05  # 5 %: tbf's burst of 64 kB at line rate
    assert measured["within_busbw"] > 5 * measured["across_busbw"]
    assert nothing_left(net) == {}
