"""`meshplan simulate`: a real CLI process replays a small trace, prints the summary and saves the plot."""

from planner.scheduler import POLICIES
from tests.support.cli import meshplan

TRACE = """job_id,submit_s,model,global_batch,iterations,req_num_gpu,req_gpu_type
a,0,gpt2-small,32,2000,1,a100
b,100,gpt3-1.3b,64,500,2,v100
c,400,gpt2-small,32,1000,4,a100
"""
MIXED = "examples/clusters/mixed-a100-v100-t4.toml"


def test_simulate_prices_with_the_planner_and_saves_a_plot(tmp_path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(TRACE)
    plot = tmp_path / "sim.png"
    p = meshplan(
        tmp_path, "simulate", "--trace", str(trace), "--cluster", MIXED, "--policy", "all", "--plot", str(plot)
    )
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if "avg JCT" in ln]
    assert [ln.split()[0] for ln in lines] == list(POLICIES)  # srtf (the default) first, then crius and sia last
    assert all("finished 3" in ln for ln in lines)
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_simulate_names_the_row_of_an_unknown_gpu_kind(tmp_path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text(TRACE.replace("4,a100", "4,h100"))
    p = meshplan(tmp_path, "simulate", "--trace", str(trace), "--cluster", MIXED)
    assert p.returncode == 1 and "row 4.req_gpu_type='h100'" in p.stderr and "Traceback" not in p.stderr
