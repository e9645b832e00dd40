"""A tiny run of the benchmark: every section produces numbers and a plot."""

import pytest
from support import bench_module

pytestmark = pytest.mark.torchrun


@pytest.mark.slow
def test_benchmark_smoke(tmp_path, capsys):
    res = bench_module().main(["--smoke", "--out", str(tmp_path)])
    launch = res["launch"][2]
    assert launch["bare"] > 0 and launch["kit"] > 0 and launch["ratio"] > 0
    assert set(launch["kit_phases"]) >= {"torch import", "DDP construction", "teardown"}
    fast = res["fast_start"][2]
    assert fast["bare_job_s"] > 0 and fast["plain_job_s"] > 0 and fast["fast_job_s"] > 0
    assert fast["fast_job_cpu_s"] > 0 and fast["server_uss_mib"] > 0
    rows = res["allreduce"][2]
    assert [r["bytes"] for r in rows] == [1024, 4194304]
    # algbw is the payload over the measured time (busbw = algbw at N = 2: 2(N-1)/N = 1)
    assert all(r["seconds"] > 0 and r["algbw"] == pytest.approx(r["bytes"] / r["seconds"])
               for r in rows)  # fmt: skip
    fit = res["alpha_beta"][2]
    assert fit["alpha_s"] > 0 and fit["beta_s_per_byte"] > 0
    sweep = res["bucket_sweep"]
    assert set(sweep) == {"gloo alone", "1 Gbit/s Ethernet", "1 Gbit/s, 1 ms away"}
    for link, points in sweep.items():
        assert [p["cap_mb"] for p in points] == [0.5, 25]
        assert all(p["exposed_s"] > 0 and p["step_s"] > p["exposed_s"] for p in points)
        assert all((p["model_s"] is None) == (link == "gloo alone") for p in points)
    live = res["live"][2]
    assert (
        0 < live["trivial_cell_ms"] and 0 < live["ddp_step_cell_ms"] < 1e3 * live["fresh_launch_s"]
    )
    assert res["memcpy"] > 0 and set(res["scaling"]) == {1, 2}
    assert (tmp_path / "results.json").exists() and (tmp_path / "allreduce.png").exists()
    assert "ratio" in capsys.readouterr().out
