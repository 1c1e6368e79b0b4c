"""`plan-parallel report`: a self-contained HTML report with its figures."""

import base64
import json
import re

import pytest
from conftest import cluster

from planner.catalog.models import resolve_model
from planner.catalog.workload import GrpoWorkload
from planner.cli.main import main
from planner.cost.request import PlanRequest
from planner.output import plan_json as plan_dict
from planner.plan import make_plan
from planner.report.html import load_trials
from planner.report.plots import pareto_front

PNG_MAGIC = b"\x89PNG"


def test_pareto_front():
    memory = [1.0, 2.0, 2.0, 3.0, 4.0]
    speed = [5.0, 4.0, 7.0, 6.0, 9.0]
    assert list(pareto_front(memory, speed)) == [0, 2, 4]


def test_plan_report_embeds_figures(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-type", "h100",
                 "--html", str(out), "--png-dir", str(tmp_path / "png")]) == 0
    page = out.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3 and all(base64.b64decode(i)[:4] == PNG_MAGIC for i in images)
    assert "Best layouts" in page and "tok/s/GPU" in page
    assert "<th>nvidia-smi peak</th>" in page and "<th>allocated working set</th>" in page
    assert sorted(p.name for p in (tmp_path / "png").iterdir()) == [
        "memory_breakdown.png", "pareto.png", "phase_times.png"]
    # nothing a user wrote is overwritten without asking
    assert main(["report", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-type", "h100",
                 "--html", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["report", "--model", "qwen2.5-7b", "--gpus", "8", "--gpu-type", "h100",
                 "--html", str(tmp_path / "other.html"), "--png-dir", str(tmp_path / "png")]) == 2
    assert "already holds report figures" in capsys.readouterr().err


def write_sweep(folder, plan):
    folder.mkdir()
    (folder / "plan.json").write_text(json.dumps(plan_dict(plan, top=1)))
    rows = ["trial,state,category,predicted_tokens_per_s_per_gpu,"
            "tokens_per_s_per_gpu,peak_memory_gib,tp,pp",
            "0,COMPLETE,ok,5400,5100,70.2,1,2",
            "1,COMPLETE,ok,5300,5350,71.0,2,1",
            "2,FAIL,oom,5200,,,1,1",
            "3,FAIL,hang,5100,,,2,2"]
    (folder / "trials.csv").write_text("\n".join(rows) + "\n")


def test_sweep_report_shows_trials(tmp_path):
    plan = make_plan(PlanRequest(resolve_model("qwen2.5-7b"), cluster(8), GrpoWorkload()))
    sweep = tmp_path / "sweep"
    write_sweep(sweep, plan)
    assert main(["report", str(sweep)]) == 0
    page = (sweep / "report.html").read_text()
    assert len(re.findall(r"data:image/png;base64", page)) == 6
    assert "oom" in page and "hang" in page
    trials = load_trials(sweep / "trials.csv")
    assert trials["measured_tokens_per_s_per_gpu"].notna().sum() == 2


def test_report_input_errors(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing")]) == 2
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "plan.json").write_text("{}")
    assert main(["report", str(tmp_path / "bad")]) == 2
    assert "does not describe a plan" in capsys.readouterr().err
    bad_csv = tmp_path / "t.csv"
    bad_csv.write_text("a,b\n1,2\n")
    with pytest.raises(Exception, match="not a plan-parallel trials.csv"):
        load_trials(bad_csv)
