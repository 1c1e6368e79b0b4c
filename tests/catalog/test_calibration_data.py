"""benchmarks/calibration_data.py: published Megatron measurements as planner inputs."""

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks.calibration_data import REFERENCE_DIR_ENV, default_path, load_cases  # noqa: E402

CSV_PATH = default_path()


def test_the_reference_data_ships_with_the_repository():
    # benchmarks/data holds a copy, so a clean clone runs every accuracy test (none skips)
    assert CSV_PATH.is_file() and CSV_PATH.parent.name == "data"


@pytest.fixture(scope="module")
def loaded():
    return load_cases()


@pytest.fixture(scope="module")
def by_row(loaded):
    return {case.row_id: case for case in loaded[0]}


def test_counts_add_up(loaded):
    cases, skipped = loaded
    with open(CSV_PATH, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(cases) >= 200
    assert len(cases) + sum(skipped.values()) == len(rows)
    assert len({case.row_id for case in cases}) == len(cases)
    with_fp4, skipped_fp4 = load_cases(include_fp4=True)
    assert len(with_fp4) == len(cases) + skipped["precision NVFP4 (include_fp4=False)"]
    assert "precision NVFP4 (include_fp4=False)" not in skipped_fp4


def test_every_case_is_a_whole_layout(loaded):
    for case in loaded[0]:
        layout = case.layout
        assert layout.tp * layout.pp * layout.cp * layout.dp == case.cluster.num_gpus, case.row_id
        assert case.model.num_attention_heads % layout.tp == 0, case.row_id
        assert case.workload.global_batch % (layout.micro_batch * layout.dp) == 0, case.row_id
        assert case.tokens_per_s_per_gpu > 0, case.row_id
        assert case.precision_family in ("bf16", "fp8")
        assert case.source in ("megatron-bridge", "dgx-cloud", "narayanan2021", "korthikanti2022")
        if not case.model.is_moe:
            assert (layout.ep, layout.etp) == (1, 1)


def test_llama3_70b_h100_bf16_row(by_row):
    case = by_row[304]  # DGX Cloud v25.04.01, Llama 3.1 70B on 64 H100, BF16
    assert case.source == "dgx-cloud"
    assert case.model.name == "Llama-3.1-70B"
    assert case.cluster.gpu.name == "H100-80GB"
    assert (case.cluster.num_gpus, case.cluster.gpus_per_node) == (64, 8)
    layout = case.layout
    assert (layout.tp, layout.pp, layout.vpp, layout.cp, layout.ep, layout.etp, layout.dp) == \
        (4, 4, 5, 2, 1, 1, 2)
    assert layout.micro_batch == 1 and layout.recompute == "none"
    assert layout.sequence_parallel and layout.distributed_optimizer
    assert (case.workload.seq_len, case.workload.global_batch, case.workload.precision) == \
        (8192, 128, "bf16")
    assert case.precision_family == "bf16"
    assert case.tokens_per_s_per_gpu == pytest.approx(1117.6)
    assert case.group == "Llama-3.1-70B|H100-80GB|64|bf16|8192"
    assert case.tokens_basis == "measured"


def test_deepseek_v3_gb300_row(by_row):
    case = by_row[1]  # Megatron-Bridge 26.08, DeepSeek-V3 on 256 GB300, MXFP8
    assert case.source == "megatron-bridge"
    assert case.model.name == "DeepSeek-V3" and case.model.num_experts == 256
    assert case.cluster.gpu.name == "GB300"
    assert (case.cluster.num_gpus, case.cluster.gpus_per_node) == (256, 4)
    layout = case.layout
    assert (layout.tp, layout.pp, layout.vpp, layout.cp, layout.ep, layout.etp, layout.dp) == \
        (1, 2, 8, 1, 32, 1, 128)
    assert layout.micro_batch == 1 and not layout.sequence_parallel
    assert (case.workload.seq_len, case.workload.global_batch, case.workload.precision) == \
        (4096, 4096, "fp8")
    assert (case.precision_family, case.precision_recipe) == ("fp8", "mxfp8")
    assert case.tokens_per_s_per_gpu == pytest.approx(6288)
    assert case.reported_tflops_per_gpu == pytest.approx(1635)


def test_narayanan_gpt_row(by_row):
    case = by_row[526]  # Narayanan 2021 Table 1: 529.6B GPT on 2520 A100
    model = case.model
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (105, 20480, 128)
    assert (model.ffn_hidden_size, model.vocab_size, model.gated_mlp, model.tied_embeddings) == \
        (4 * 20480, 51200, False, True)
    assert model.params.total == pytest.approx(529.6e9, rel=2e-3)
    assert case.source == "narayanan2021"
    assert case.cluster.gpu.name == "A100-80GB"
    layout = case.layout
    assert (layout.tp, layout.pp, layout.vpp, layout.cp, layout.dp, layout.micro_batch) == \
        (8, 35, 3, 1, 9, 1)
    assert layout.recompute == "full" and not layout.sequence_parallel
    assert not layout.distributed_optimizer
    assert (case.workload.seq_len, case.workload.global_batch, case.workload.precision) == \
        (2048, 2520, "fp16")
    # Eq. 3 of the paper: 96 B s l h^2 (1 + s/6h + V/16lh) FLOPs per iteration.
    l, h, s, v = 105, 20480, 2048, 51200
    expected = 163e12 / (96 * l * h * h * (1 + s / (6 * h) + v / (16 * l * h)))
    assert case.tokens_per_s_per_gpu == pytest.approx(expected)
    assert case.tokens_basis == "tflops_eq3"
    # and it agrees with the table's aggregate 410.2 PFLOP/s to its rounding
    assert case.tokens_per_s_per_gpu * 2520 == pytest.approx(410.2e15 / 163e12 * expected,
                                                             rel=5e-3)


def test_korthikanti_step_time_row(by_row):
    case = by_row[542]  # GPT-3 175B, SP + selective recompute, 64 A100, 13.75 s per step
    assert case.layout.recompute == "selective" and case.layout.sequence_parallel
    assert case.tokens_per_s_per_gpu == pytest.approx(64 * 2048 / (13.75 * 64))
    assert case.tokens_basis == "step_time"
    baseline = by_row[543]
    assert baseline.layout.recompute == "full" and not baseline.layout.sequence_parallel


def test_reference_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv(REFERENCE_DIR_ENV, str(tmp_path))
    assert default_path() == tmp_path / "calibration_layouts.csv"
