"""`plan-parallel profile`: communication share and overlap from Chrome traces built here."""

import gzip
import json

import pytest

from planner.cli.main import main
from planner.diagnose.profile import kernel_family, profile_trace, read_trace
from planner.errors import PlanInputError


def kernel(name, ts, dur, stream):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0,
            "tid": stream}


def step(number, ts, dur, category="gpu_user_annotation"):
    return {"ph": "X", "cat": category, "name": f"ProfilerStep#{number}", "ts": ts, "dur": dur,
            "pid": 0, "tid": 7}


def trace(rank=0):
    """Two 1000-us steps.  Step 1: 200 us of NCCL all-gather, 150 us of it under a GEMM on
    another stream.  Step 2: 300 us of all-to-all with no compute beside it."""
    events = [
        step(1, 0, 1000), step(2, 1000, 1000),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 0, 650, 7),
        kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
               500, 200, 20),
        kernel("elementwise_kernel", 750, 200, 7),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 1000, 500, 7),
        kernel("ncclDevKernel_AllToAll_RING_LL", 1600, 300, 21),
    ]
    return {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": 2}}


def test_comm_share_and_overlap_per_step():
    first, second = profile_trace(trace(), rank=0)
    assert first.step_s == pytest.approx(1e-3) and first.comm_s == pytest.approx(200e-6)
    assert first.comm_share == pytest.approx(0.2)
    assert first.overlap == pytest.approx(150 / 200)
    assert first.top_comm_kernels[0][0] == "AllGather"
    assert second.comm_share == pytest.approx(0.3) and second.overlap == 0.0
    assert second.top_comm_kernels[0][0] == "AllToAll"


def test_concurrent_comm_kernels_are_not_counted_twice():
    data = trace()
    data["traceEvents"].append(kernel("ncclDevKernel_ReduceScatter_RING", 550, 100, 22))
    first = profile_trace(data, 0)[0]
    assert first.comm_s == pytest.approx(200e-6)


def test_cli_reads_gzip_and_gives_advice(tmp_path, capsys):
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(trace(rank))
                                                                     .encode()))
    assert main(["profile", str(tmp_path), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {s["rank"] for s in data["steps"]} == {0, 1} and len(data["steps"]) == 4
    assert data["within_targets"] is False
    assert any("CUDA_DEVICE_MAX_CONNECTIONS=1" in tip for tip in data["advice"])
    assert any("AllToAll" in tip for tip in data["advice"])
    assert main(["profile", str(tmp_path / "rank0.json.gz")]) == 0
    assert "NOT met" in capsys.readouterr().out


def test_without_step_annotations_the_trace_is_one_step():
    data = trace()
    data["traceEvents"] = [e for e in data["traceEvents"] if e["cat"] == "kernel"]
    (only,) = profile_trace(data, 0)
    assert only.step_s == pytest.approx(1900e-6)


@pytest.mark.parametrize("content,needle", [(b"{nope", "cannot read"),
                                            (b'{"a": 1}', "not a Chrome trace")])
def test_bad_traces(tmp_path, content, needle):
    path = tmp_path / "t.json"
    path.write_bytes(content)
    with pytest.raises(PlanInputError, match=needle):
        read_trace(path)
    assert main(["profile", str(path)]) == 2


def test_kernel_family_names():
    assert kernel_family("ncclDevKernel_ReduceScatter_RING_LL") == "ReduceScatter"
    assert kernel_family("ncclKernel_SendRecv_RING") == "SendRecv"
