"""The testbed's CPU accounting: /proc/stat, /proc/<pid>/stat and /proc/loadavg
parsed from fixed text, the shares and seconds computed from two readings, and
``dlcp testbed suite --link-rate`` (no root)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest

from dlcp.cli import main
from testbed import experiments as ex
from testbed.cpu_usage import (
    CpuReading,
    MachineTimes,
    TrainingCpu,
    cpu_summary,
    machine_shares,
    parse_loadavg,
    parse_proc_stat,
    parse_process_ticks,
    read_cpu,
)

# two readings of a 2-CPU machine, 10 s apart at 100 ticks a second: 2000 ticks in all
STAT_BEFORE = """\
cpu  1000 50 400 8000 100 0 200 0 0 0
cpu0 500 25 200 4000 50 0 100 0 0 0
cpu1 500 25 200 4000 50 0 100 0 0 0
intr 123456 0 0
ctxt 987654
btime 1764370000
"""
# between them: user 600, nice 0, system 200, idle 700, iowait 100, softirq 400
STAT_AFTER = """\
cpu  1600 50 600 8700 200 0 600 0 0 0
cpu0 800 25 300 4350 100 0 300 0 0 0
cpu1 800 25 300 4350 100 0 300 0 0 0
intr 223456 0 0
"""


def _pid_stat(pid: int, comm: str, utime: int, stime: int) -> str:
    # fields 3.. of /proc/<pid>/stat: state, ppid, pgrp, session, tty, tpgid, flags,
    # minflt, cminflt, majflt, cmajflt, utime (14), stime (15), cutime, cstime, ...
    rest = f"S 1 {pid} {pid} 0 -1 4194560 900 0 3 0 {utime} {stime} 7 8 20 0 5 0 100"
    return f"{pid} ({comm}) {rest}\n"


def test_proc_stat_is_read_from_its_aggregate_line() -> None:
    t = parse_proc_stat(STAT_BEFORE)
    assert t == MachineTimes(1000, 50, 400, 8000, 100, 0, 200, 0, cpus=2)
    assert t.total == 9750  # guest time (the last two) is inside user and nice already


def test_idle_and_softirq_shares_between_two_readings() -> None:
    shares = machine_shares(parse_proc_stat(STAT_BEFORE), parse_proc_stat(STAT_AFTER))
    assert shares == {
        "idle_pct": 40.0,  # (700 idle + 100 iowait) / 2000
        "iowait_pct": 5.0,
        "user_pct": 30.0,
        "system_pct": 10.0,
        "irq_pct": 0.0,
        "softirq_pct": 20.0,
        "steal_pct": 0.0,
    }


def test_a_counter_that_went_backwards_counts_as_zero() -> None:
    # iowait can decrease on some kernels: the share is not made negative
    before = parse_proc_stat(STAT_BEFORE)
    after = parse_proc_stat(STAT_AFTER.replace(" 8700 200 ", " 8700 90 ", 1))
    shares = machine_shares(before, after)
    assert shares["iowait_pct"] == 0.0
    assert shares["idle_pct"] == pytest.approx(100 * 700 / 1900, abs=0.01)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("intr 1 2\nctxt 3\n", "no aggregate 'cpu' line"),
        ("cpu  1 2 3 4\ncpu0 1 2 3 4\n", "has 4 counters, expected 8+"),
        ("cpu  1 2 3 4 5 6 7 8\n", "no per-CPU 'cpuN' lines"),
    ],
)
def test_text_that_is_not_proc_stat_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_proc_stat(text)


def test_no_time_between_readings_is_refused() -> None:
    t = parse_proc_stat(STAT_BEFORE)
    with pytest.raises(ValueError, match="no CPU time passed"):
        machine_shares(t, t)


def test_process_ticks_are_user_plus_system_whatever_the_name_holds() -> None:
    assert parse_process_ticks(_pid_stat(4242, "python3", 1234, 56)) == 1290
    # a command name may hold spaces and parentheses: fields are counted after the last ')'
    assert parse_process_ticks(_pid_stat(7, "a (b) c", 10, 5)) == 15
    with pytest.raises(ValueError, match="not a /proc/<pid>/stat line"):
        parse_process_ticks("4242 python3 S 1")


def test_load_averages() -> None:
    assert parse_loadavg("3.86 5.84 4.68 3/512 9626\n") == (3.86, 5.84, 4.68)
    with pytest.raises(ValueError, match="not /proc/loadavg"):
        parse_loadavg("3.86\n")


def _reading(at: float, stat: str, ticks: dict[str, int | None]) -> CpuReading:
    return CpuReading(at, parse_proc_stat(stat), (2.5, 2.0, 1.5), ticks)


def test_summary_of_a_window() -> None:
    start = _reading(100.0, STAT_BEFORE, {"rank0": 100, "rank1": 200, "background-sink": 0})
    end = _reading(110.0, STAT_AFTER, {"rank0": 400, "rank1": 500, "background-sink": 50})
    s = cpu_summary(start, end, ticks_per_second=100)
    assert s["window_s"] == 10.0 and s["cpus"] == 2
    assert s["idle_pct"] == 40.0 and s["softirq_pct"] == 20.0
    assert s["load_avg_start"] == [2.5, 2.0, 1.5]
    assert s["process_cpu_s"] == {"rank0": 3.0, "rank1": 3.0, "background-sink": 0.5}
    # the ranks only, against 2 CPUs x 10 s
    assert s["ranks_cpu_s"] == 6.0 and s["ranks_cpu_pct"] == 30.0
    assert "softirq" in s["not_attributed"]


def test_a_rank_gone_at_either_end_leaves_the_ranks_total_unknown() -> None:
    start = _reading(0.0, STAT_BEFORE, {"rank0": 100, "rank1": 200})
    end = _reading(10.0, STAT_AFTER, {"rank0": 400, "rank1": None})
    s = cpu_summary(start, end, ticks_per_second=100)
    assert s["process_cpu_s"] == {"rank0": 3.0, "rank1": None}
    assert s["ranks_cpu_s"] is None and s["ranks_cpu_pct"] is None
    assert s["idle_pct"] == 40.0  # the machine's shares stand


def test_a_reading_of_a_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text(STAT_BEFORE)
    (tmp_path / "loadavg").write_text("1.00 0.50 0.25 2/300 77\n")
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "stat").write_text(_pid_stat(4242, "python3", 30, 12))
    r = read_cpu({"rank0": 4242, "rank1": 4243}, proc=tmp_path)
    assert r.machine.cpus == 2 and r.load == (1.0, 0.5, 0.25)
    assert r.processes == {"rank0": 42, "rank1": None}  # 4243: gone


def test_this_machine_over_cpu_this_process_spends() -> None:
    """Two real readings of /proc around work this process does: its own seconds
    are counted, the machine's shares add up."""
    cpu = TrainingCpu()
    cpu.stop()  # before a start: no reading
    assert cpu.last is None and cpu.summary() is None
    cpu.track("rank0", os.getpid())
    cpu.start()
    first = cpu.first
    assert first is not None and first.processes["rank0"] is not None
    # work until the kernel has charged this process 5 more ticks
    own = Path(f"/proc/{os.getpid()}/stat")
    while parse_process_ticks(own.read_text()) < first.processes["rank0"] + 5:
        sum(range(10_000))
    cpu.stop()
    s = cpu.summary()
    assert s is not None
    hz = os.sysconf("SC_CLK_TCK")
    assert s["process_cpu_s"]["rank0"] >= 5 / hz and s["ranks_cpu_s"] >= 5 / hz
    assert s["cpus"] == os.cpu_count()
    parts = ("idle_pct", "user_pct", "system_pct", "irq_pct", "softirq_pct", "steal_pct")
    assert sum(s[k] for k in parts) == pytest.approx(100.0, abs=0.1)


def test_progress_reads_at_the_start_and_the_end_of_training() -> None:
    events: list[str] = []
    p = ex._Progress(
        io.StringIO(), "clean-dlcp", 0.0, None,
        (lambda: events.append("start"), lambda: events.append("end")),
    )  # fmt: skip
    p.write("[rank1]: digits CNN (540362 parameters), 4 ranks\n")  # not rank 0
    p.write("[rank0]: digits CNN (540362 parameters), 4 ranks, transport dlcp\n")
    p.write("[rank0]: epoch  1/2  test acc 50%\n")
    assert events == ["start"]
    p.write("[rank0]: epoch  2/2  test acc 60%\n")
    assert events == ["start", "end"]


# --- dlcp testbed suite --link-rate ------------------------------------------------------


def test_the_suite_runs_every_run_at_the_link_rate_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, float]] = []

    def fake_run(config: ex.ExperimentConfig, **_: Any) -> dict[str, Any]:
        seen.append((config.name, config.link_rate_mbit))
        return dict.fromkeys(ex.CSV_FIELDS, 0) | {
            "scenario": config.scenario, "transport": config.transport, "ablation": "",
            "router_drops": "", "switch": "linux", "profile": config.profile,
            "link_rate_mbit": config.link_rate_mbit,
        }  # fmt: skip

    monkeypatch.setattr(ex, "run_experiment", fake_run)
    monkeypatch.setattr(ex, "plot", lambda results: None)
    argv = ["testbed", "suite", "--scenarios", "clean", "--link-rate", "50", "--results"]
    assert main([*argv, str(tmp_path)]) == 0
    assert seen == [("clean-gloo-50mbit", 50.0), ("clean-dlcp-50mbit", 50.0)]
    seen.clear()
    assert main(["testbed", "suite", "--scenarios", "clean", "--results", str(tmp_path)]) == 0
    assert [rate for _, rate in seen] == [ex.LINK_RATE_MBIT] * 2


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "argument --link-rate: must be a positive number of Mbit/s, got 0"),
        ("-50", "argument --link-rate: must be a positive number of Mbit/s, got -50"),
        ("inf", "argument --link-rate: must be a positive number of Mbit/s, got inf"),
        ("fast", "argument --link-rate: 'fast' is not a number of Mbit/s"),
    ],
)
@pytest.mark.parametrize("command", ["suite", "run"])
def test_a_bad_link_rate_is_a_usage_error(
    command: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["testbed", command, "--link-rate", value]
    if command == "run":
        argv += ["--scenario", "clean", "--transport", "dlcp"]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert says in capsys.readouterr().err


def test_a_link_rate_over_bmv2_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["testbed", "suite", "--switch", "bmv2", "--link-rate", "50"]
    assert main([*argv, "--results", str(tmp_path)]) == 2
    assert "--link-rate shapes the Linux routers' egress" in capsys.readouterr().err
    assert not (tmp_path / ex.CSV_NAME).exists()


def test_the_table_shows_the_link_rate_and_how_busy_the_cpus_were(tmp_path: Path) -> None:
    row = dict.fromkeys(ex.CSV_FIELDS, "0") | {
        "scenario": "clean", "transport": "dlcp", "ablation": "", "router_drops": "",
        "switch": "linux", "profile": "dlcp", "link_rate_mbit": "50.0",
        "load_avg_1m": "3.5", "cpu_idle_pct": "41.25", "ranks_cpu_s": "12.34",
    }  # fmt: skip
    ex.append_csv(tmp_path, row)
    old = row | {"link_rate_mbit": "", "load_avg_1m": "", "cpu_idle_pct": "", "ranks_cpu_s": ""}
    ex.append_csv(tmp_path, old)  # a row from before the columns: 200 Mbit/s, CPU unknown
    lines = ex.table(ex.read_csv(tmp_path)).splitlines()
    assert "| link Mbit/s | load | CPU idle % | ranks CPU s |" in lines[0]
    assert "| 50 | 3.50 | 41.2 | 12.3 |" in lines[2]
    assert "| 200 | - | - | - |" in lines[3]


def test_a_failed_reading_leaves_no_summary_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import testbed.cpu_usage as cu

    def unreadable(processes: Any, proc: Path = Path("/proc")) -> CpuReading:
        raise ValueError("/proc/stat has no aggregate 'cpu' line")

    cpu = TrainingCpu()
    monkeypatch.setattr(cu, "read_cpu", unreadable)
    cpu.start()  # does not raise: the run goes on
    cpu.stop()
    assert cpu.summary() is None
    assert cpu.failure == "reading /proc failed: /proc/stat has no aggregate 'cpu' line"
    line = ex.cpu_line(None, cpu.failure)
    assert line == "CPU: not read (reading /proc failed: /proc/stat has no aggregate 'cpu' line)"
