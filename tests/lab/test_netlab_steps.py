"""Ground truth from the ranks' step logs (the format workers/rank.py writes). NOTE: the step
times below are invented: three ranks stepping every 40 ms; from t=10 s rank 1 computes 15 ms
longer, its peers wait for it inside the all-reduce, and every step takes 10 ms longer."""
from __future__ import annotations

from pathlib import Path

import pytest

from skewd.lab.netlab.steps import read_steps, step_stats


def write_logs(tmp: Path) -> list[Path]:
    logs = [tmp / f"rank{i}.log" for i in range(3)]
    fh = [open(p, "w") for p in logs]
    fh[0].write('# {"backend": "torch", "rank": 0}\n')
    t = 0.0
    for k in range(500):
        late = t >= 10.0
        period = 0.050 if late else 0.040
        for i in range(3):
            comm_start = t + 0.025 + (0.015 if late and i == 1 else 0.0) + 0.0001 * i
            fh[i].write(f"{k} {t:.6f} {comm_start:.6f} {t + period:.6f} {0.015 if late and i == 1 else 0:.4f}\n")
        t += period
    fh[2].write("500 20.5 20.52")  # cut by a kill
    for f in fh:
        f.close()
    return logs


def test_the_faulty_ranks_lag_and_the_groups_slowdown(tmp_path: Path) -> None:
    logs = write_logs(tmp_path)
    assert len(read_steps(logs[2])) == 500  # header and the torn last line skipped
    st = step_stats(logs, t0=0.0, onset=10.0, end=20.0, faulty=1)
    assert st["n0"]["before"]["period_s"] == pytest.approx(0.040, abs=1e-6)
    assert st["n0"]["after"]["period_s"] == pytest.approx(0.050, abs=1e-6)
    assert st["slowdown_s"] == pytest.approx(0.010, abs=1e-6)
    assert st["straggler_lag_s"]["before"] == pytest.approx(0.0, abs=1e-3)
    assert st["straggler_lag_s"]["after"] == pytest.approx(0.015, abs=1e-3)


def test_a_healthy_run_has_no_fault_measures(tmp_path: Path) -> None:
    st = step_stats(write_logs(tmp_path), t0=0.0, onset=None, end=20.0, faulty=None)
    assert "slowdown_s" not in st and "straggler_lag_s" not in st and "after" not in st["n0"]
