"""Training experiments on the testbed: the pure parts (no root), and short real
runs over the leaf-spine with each transport (root)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from testbed import experiments as ex
from testbed.experiment_config import dlcp_settings
from testbed.netns import missing_tools

MISSING = missing_tools(loss=True, offloads=True)
needs_root = pytest.mark.skipif(
    bool(MISSING), reason=f"needs {', '.join(MISSING)} (network namespaces)"
)

# --- no root ---------------------------------------------------------------------------


def test_ablation_mapping() -> None:
    # data to the protocol's port, the one the P4 program parses as DLCP, in
    # datagrams as large as the links allow
    base = {"DLCP_DATA_PORT": "9400", "DLCP_MTU": "auto"}
    env, flags = dlcp_settings("clean", ())
    assert env == {"DLCP_N_PATHS": "8", **base} and flags == ["--p", "0.05"]
    env, flags = dlcp_settings("incast", ("spray", "bound"))
    assert env == {"DLCP_N_PATHS": "1", **base}
    assert flags == ["--p", "0", "--collective", "ps"]
    assert dlcp_settings("clean", ("priority",))[0]["DLCP_CLASSIFIER"] == "magnitude"
    assert dlcp_settings("clean", ("drop",))[0]["DLCP_CLASSIFIER"] == "layer"
    assert dlcp_settings("clean", ("drop", "priority"))[0]["DLCP_CLASSIFIER"] == "none"
    assert ex.run_name("loss", "dlcp", ("spray", "bound")) == "loss-dlcp-no-bound+spray"
    assert ex.run_name("loss", "gloo") == "loss-gloo"
    assert ex.run_name("clean", "dlcp", mtu=9000) == "clean-dlcp-mtu9000"


def test_the_link_mtu_reaches_the_topology_name_and_csv() -> None:
    config = ex.ExperimentConfig("clean", "dlcp", mtu=9000)
    assert config.name == "clean-dlcp-mtu9000"
    assert "mtu" in ex.CSV_FIELDS
    with pytest.raises(ValueError, match=r"mtu=100 outside 576\.\.65535"):
        ex.ExperimentConfig("clean", "gloo", mtu=100)


def test_each_transport_gets_its_own_queueing_unless_told() -> None:
    # the baseline runs on a plain FIFO (a network without DLCP's configuration)
    assert ex.default_profile("gloo") == "fifo" and ex.default_profile("dlcp") == "dlcp"
    assert ex.run_name("clean", "gloo", (), "linux", "fifo") == "clean-gloo"
    assert ex.run_name("clean", "gloo", (), "linux", "dlcp") == "clean-gloo-on-dlcp"
    name = ex.run_name("clean", "dlcp", ("spray",), "linux", "fifo")
    assert name == "clean-dlcp-no-spray-on-fifo"


def test_runs_of_other_settings_keep_their_own_results(tmp_path: Path) -> None:
    # a run at another link rate or batch size has its own name (its JSON file) ...
    assert ex.run_name("clean", "dlcp", link_rate_mbit=100) == "clean-dlcp-100mbit"
    assert ex.run_name("clean", "dlcp", batch_size=32) == "clean-dlcp-batch32"
    assert ex.run_name("clean", "dlcp", hidden=1024) == "clean-dlcp-hidden1024"
    assert ex.run_name("clean", "dlcp", link_rate_mbit=200, batch_size=16, hidden=64) == (
        "clean-dlcp"
    )
    # (BMv2's links are not shaped: no rate in its names)
    assert ex.run_name("clean", "dlcp", (), "bmv2", link_rate_mbit=100) == "clean-dlcp-bmv2"
    # ... and its own CSV row; a row from before the columns had the defaults
    row = dict.fromkeys(ex.CSV_FIELDS, "0")
    base = {**row, "scenario": "clean", "transport": "dlcp", "ablation": "", "switch": "linux",
            "profile": "dlcp", "hidden": "64"}  # fmt: skip
    old_fields = [f for f in ex.CSV_FIELDS if f not in ("link_rate_mbit", "batch_size", "hidden")]
    with (tmp_path / ex.CSV_NAME).open("w", newline="") as f:  # an old file
        w = csv.DictWriter(f, fieldnames=old_fields, extrasaction="ignore")
        w.writeheader()
        w.writerow({**base, "final_accuracy": "10"})
    ex.append_csv(tmp_path, {**base, "final_accuracy": "20", "link_rate_mbit": "100",
                             "batch_size": "16"})  # fmt: skip
    ex.append_csv(tmp_path, {**base, "final_accuracy": "30", "link_rate_mbit": "200.0",
                             "batch_size": "16"})  # fmt: skip (the defaults: newer than 10)
    ex.append_csv(tmp_path, {**base, "final_accuracy": "40", "link_rate_mbit": "200.0",
                             "batch_size": "16", "hidden": "1024"})  # fmt: skip
    assert [r["final_accuracy"] for r in ex.read_csv(tmp_path)] == ["30", "20", "40"]


def test_run_settings_are_validated() -> None:
    for kw in ({"epochs": 0}, {"batch_size": 0}, {"hidden": 0}, {"link_rate_mbit": -5.0}):
        with pytest.raises(ValueError, match="must be >= 1"):
            ex.ExperimentConfig("clean", "dlcp", **kw)  # type: ignore[arg-type]


def test_bad_arguments_are_rejected_before_building() -> None:
    with pytest.raises(ValueError, match="unknown profile 'wred'"):
        ex.ExperimentConfig("clean", "gloo", profile="wred")
    with pytest.raises(ValueError, match="BMv2 runs the P4 program"):
        ex.ExperimentConfig("clean", "gloo", switch="bmv2", profile="fifo")
    with pytest.raises(ValueError, match="gloo_profile='dlcp'"):
        ex.suite(["clean"], switch="bmv2", gloo_profile="dlcp")
    with pytest.raises(ValueError, match="unknown scenario"):
        ex.ExperimentConfig("nope", "dlcp")
    with pytest.raises(ValueError, match="unknown ablation"):
        ex.ExperimentConfig("clean", "dlcp", ablate=("fast",))
    with pytest.raises(ValueError, match="dlcp only"):
        ex.ExperimentConfig("clean", "gloo", ablate=("spray",))


def test_a_suite_runs_every_run_with_its_model_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dlcp testbed suite --hidden 1024``: every run of the suite, ablations
    included, trains the wide model (a fake stands in for the runs here)."""
    seen: list[tuple[str, str, tuple[str, ...], int]] = []

    def fake_run(config: ex.ExperimentConfig, **_: Any) -> dict[str, Any]:
        scenario, transport, ablate = config.scenario, config.transport, config.ablate
        seen.append((scenario, transport, ablate, config.hidden))
        return dict.fromkeys(ex.CSV_FIELDS, 0) | {
            "scenario": scenario, "transport": transport, "ablation": ",".join(ablate),
            "router_drops": "", "switch": "linux", "profile": "dlcp",
        }  # fmt: skip

    monkeypatch.setattr(ex, "run_experiment", fake_run)
    monkeypatch.setattr(ex, "plot", lambda results: None)
    failures, rows = ex.suite(["clean", "loss"], ablation_scenarios=["loss"], hidden=1024,
                              results=tmp_path, out=io.StringIO())  # fmt: skip
    assert failures == 0 and len(rows) == 4 + len(ex.ABLATIONS)
    assert {h for *_, h in seen} == {1024}
    assert [(s, t) for s, t, ab, _ in seen if not ab] == [
        ("clean", "gloo"), ("clean", "dlcp"), ("loss", "gloo"), ("loss", "dlcp")
    ]


def test_class_totals_sum_over_routers() -> None:
    def c(p: int, d: int) -> dict[str, int]:
        return {"packets": p, "bytes": 0, "drops": d, "backlog": 0}

    before: Any = {"leaf1": {"spine1": {"c7-protected": c(10, 1)}}, "spine1": {}}
    after: Any = {
        "leaf1": {"spine1": {"c7-protected": c(30, 2)}},
        "spine1": {"leaf2": {"c7-protected": c(5, 0), "best-effort": c(0, 0)}},
    }
    tot = ex.class_totals(before, after)
    assert tot["c7-protected"] == {"packets": 25, "drops": 1}
    assert ex.drops_summary(tot) == "c7-protected:1/25"
    assert ex.per_link_packets(before, after) == {
        "leaf1": {"spine1": {"c7-protected": 20}},
        "spine1": {"leaf2": {"c7-protected": 5}},
    }
    # drops per egress: only the interface whose queue dropped
    assert ex.per_link_drops(before, after) == {"leaf1": {"spine1": {"c7-protected": 1}}}


def test_csv_newest_row_wins_and_plot(tmp_path: Path) -> None:
    row = dict.fromkeys(ex.CSV_FIELDS, "0")
    for acc in ("50", "90"):
        ex.append_csv(tmp_path, {**row, "scenario": "clean", "transport": "gloo",
                                 "ablation": "", "final_accuracy": acc})  # fmt: skip
    ex.append_csv(tmp_path, {**row, "scenario": "loss", "transport": "dlcp",
                             "ablation": "no-spray", "final_accuracy": "80"})  # fmt: skip
    rows = ex.read_csv(tmp_path)
    assert [r["final_accuracy"] for r in rows] == ["90", "80"]
    assert "| clean | gloo | - | 90.0 |" in ex.table(rows)
    # the same run on the other queueing is another row, not a newer one
    fifo = {**row, "scenario": "clean", "transport": "gloo", "ablation": "", "profile": "fifo"}
    ex.append_csv(tmp_path, {**fifo, "final_accuracy": "70"})
    rows = ex.read_csv(tmp_path)
    assert [r["final_accuracy"] for r in rows] == ["90", "80", "70"]
    assert ex.table(rows).splitlines()[-1].endswith("| fifo |")
    png = ex.plot(tmp_path)
    assert png is not None and png.stat().st_size > 1000


def test_rows_from_before_the_profile_column_read_as_the_dlcp_profile(tmp_path: Path) -> None:
    old_fields = [f for f in ex.CSV_FIELDS if f not in ("profile", "switch")]
    row = dict.fromkeys(ex.CSV_FIELDS, "0")
    with (tmp_path / ex.CSV_NAME).open("w", newline="") as f:  # an old file
        w = csv.DictWriter(f, fieldnames=old_fields, extrasaction="ignore")
        w.writeheader()
        w.writerow({**row, "scenario": "clean", "transport": "gloo", "ablation": ""})
    # today's Gloo row of the same run (on its FIFO) is another row, not a newer one
    ex.append_csv(tmp_path, {**row, "scenario": "clean", "transport": "gloo", "ablation": "",
                             "switch": "linux", "profile": "fifo"})  # fmt: skip
    rows = ex.read_csv(tmp_path)
    assert len(rows) == 2
    lines = ex.table(rows).splitlines()
    assert lines[2].endswith("| linux | dlcp |") and lines[3].endswith("| linux | fifo |")


# --- real runs (root) ------------------------------------------------------------------


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    if MISSING:
        pytest.skip(f"needs {', '.join(MISSING)} (network namespaces)")
    res = tmp_path_factory.mktemp("results")
    out: dict[str, dict[str, Any]] = {}
    for transport in ("gloo", "dlcp"):
        log = io.StringIO()
        config = ex.ExperimentConfig("clean", transport, epochs=1, batch_size=32, results=res)
        out[transport] = ex.run_experiment(config, out=log)
        # (batch 32 is not the default: the run's name says so)
        assert f"[testbed] clean-{transport}-batch32: epoch 1/1 done" in log.getvalue()
        assert "[rank3]:" in log.getvalue()  # every rank's output is streamed, prefixed
    return res, out


@needs_root
@pytest.mark.parametrize("transport", ["gloo", "dlcp"])
def test_short_training_run_completes(
    runs: tuple[Path, dict[str, dict[str, Any]]], transport: str
) -> None:
    res, out = runs
    r = out[transport]
    assert r["final_accuracy"] is not None and r["final_accuracy"] > 10.0  # > chance
    assert r["train"]["world_size"] == 4
    saved = json.loads((res / f"clean-{transport}-batch32.json").read_text())
    assert saved["transport"] == transport and saved["train"]["epochs"]
    for epoch in saved["train"]["epochs"]:  # every iteration's time, slowest rank
        times = epoch["iteration_s"]
        assert len(times) == epoch["iterations"] and all(t > 0 for t in times)
        # each is the max over ranks, so their sum covers every rank's timed loop
        # (the loop's untimed microseconds aside) and at most all ranks' together;
        # nothing tighter: ranks wait in different iterations (a fast rank's wait
        # shows up in its next backward)
        rank_loops = epoch["iter_s"] * epoch["iterations"]  # mean over ranks
        assert 0.95 * rank_loops <= sum(times) <= 1.001 * saved["train"]["world_size"] * rank_loops
    with (res / ex.CSV_NAME).open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["scenario"], r["transport"]) for r in rows} == {("clean", "gloo"), ("clean", "dlcp")}
    assert (res / ex.PNG_NAME).stat().st_size > 1000
    # the CPU over the training: read at its start and end, from the four ranks
    cpu = saved["cpu"]
    assert set(cpu["process_cpu_s"]) == {f"rank{i}" for i in range(4)}
    assert cpu["window_s"] > 0 and cpu["ranks_cpu_s"] > 0 and 0 <= cpu["idle_pct"] <= 100
    row = next(row for row in rows if row["transport"] == transport)
    assert float(row["cpu_idle_pct"]) == cpu["idle_pct"]
    if transport == "dlcp":
        # DSCP-marked DLCP traffic reached the priority classes of the profile
        assert r["profile"] == "dlcp"
        assert any(k != "c0-drop" and k != "best-effort" and v["packets"] > 100
                   for k, v in r["router_classes"].items())  # fmt: skip
        assert r["retransmissions"] is not None and r["lost_fraction"] is not None
        # (each rank's counters came with the training's result; late ones summed)
        counters = saved["train"]["endpoint_counters"]
        assert r["late_packets"] == sum(c["late_packets"] for c in counters) >= 0
        assert len(counters) == 4 and all(c["datagrams_in"] > 0 for c in counters)
    else:  # the baseline's routers had one FIFO, which carried all of its traffic
        # (its TCP reports neither lost elements nor retransmissions: blank, not 0)
        assert r["retransmissions"] is None and r["lost_fraction"] is None
        assert r["late_packets"] is None
        row = next(row for row in rows if row["transport"] == "gloo")
        assert row["retransmissions"] == "" and row["lost_fraction"] == ""
        assert r["profile"] == "fifo" and saved["setup"]["profile"] == "fifo"
        assert set(r["router_classes"]) == {"best-effort"}
        assert r["router_classes"]["best-effort"]["packets"] > 1000


@needs_root
def test_dlcp_sprays_over_both_spines(runs: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    """DLCP_N_PATHS=8 spreads a flow over both spines. The ring has two flows between
    the leaves: h2 -> h3 (spines' egress towards leaf2) and h4 -> h1 (towards
    leaf1). Without spraying each is pinned to one spine (measured: one spine
    carries 0 of its DLCP packets); with 8 source ports a flow lands on both
    spines unless all 8 ephemeral ports hash alike (1/128 per flow), so the test
    asks that at least one of the two flows is split (fails by chance 1/16384).
    The sender learns per-path loss and gives a lossy path as little as 2 % of the
    batches, so "split" means more than 1 % of the flow's packets on each spine.
    DLCP packets = every profile class but c0-drop (TOS 0: Gloo's and other TCP)."""
    links = runs[1]["dlcp"]["router_link_packets"]

    def dlcp_packets(spine: str, towards: str) -> int:
        classes = links[spine][towards]
        return sum(v for k, v in classes.items() if k not in ("c0-drop", "best-effort"))

    shares = []
    for leaf in ("leaf1", "leaf2"):
        s1, s2 = dlcp_packets("spine1", leaf), dlcp_packets("spine2", leaf)
        assert s1 + s2 > 500, (leaf, s1, s2)
        shares.append(min(s1, s2) / (s1 + s2))
    assert max(shares) > 0.01, (shares, links)


def test_progress_calls_back_after_each_epoch_rank0_reports() -> None:
    seen: list[int] = []
    sink = io.StringIO()
    p = ex._Progress(sink, "clean-dlcp", 0.0, seen.append)
    p.write("[rank1]: epoch  1/2  test acc 50%\n[rank0]: epoch  1/2  test acc 51%\n")
    p.write("[rank0]: something else\n[rank0]: epoch  2/2  test acc 60%\n")
    assert seen == [1, 2]  # rank 0's epochs only, in order
    assert sink.getvalue().count("[testbed] clean-dlcp: epoch") == 2


@needs_root
def test_spine_down_fails_the_link_mid_run(tmp_path: Path) -> None:
    """spine-down over 2 epochs: leaf1--spine1 goes down when rank 0 reports its
    first epoch, the routes re-converge while the ranks train, and training ends."""
    log = io.StringIO()
    config = ex.ExperimentConfig(
        "spine-down", "dlcp", epochs=2, batch_size=32, results=tmp_path, plot_after=False
    )
    r = ex.run_experiment(config, out=log)
    text = log.getvalue()
    down = text.index("[testbed] spine-down-dlcp-batch32: leaf1--spine1 down after epoch 1")
    assert text.index("[testbed] spine-down-dlcp-batch32: epoch 1/2 done") < down
    assert down < text.index("[testbed] spine-down-dlcp-batch32: epoch 2/2 done")
    assert r["setup"]["link_down"].startswith("after epoch 1")
    assert len(r["train"]["epochs"]) == 2 and r["final_accuracy"] > 10.0


@needs_root
@pytest.mark.parametrize("scenario", ["loss", "background", "incast"])
def test_impaired_scenario_runs_with_its_impairment(tmp_path: Path, scenario: str) -> None:
    """One short DLCP run of each impaired scenario: its impairment really acted
    (the loss rules dropped packets, the cross traffic flowed, the parameter
    server took the pushes), training finished, and any gradient loss stayed
    within the bound (p = 0.05)."""
    config = ex.ExperimentConfig(
        scenario, "dlcp", epochs=1, batch_size=32, results=tmp_path, plot_after=False
    )
    r = ex.run_experiment(config, out=io.StringIO())
    assert r["final_accuracy"] > 10.0 and len(r["train"]["epochs"]) == 1
    assert r["lost_fraction"] <= 0.05
    setup = r["setup"]
    if scenario == "loss":
        dropped = sum(setup["loss_rule_drops"].values())
        assert dropped > 0, setup["loss_rule_drops"]
        assert f"loss-rule:{dropped}/0" in r["router_drops"]  # (the routers' drops, all)
    elif scenario == "background":
        # the flow runs until training ends, then its sender is stopped: the sink counts
        got, sent = setup["background"]["received"], setup["background"]["sent"]
        assert got.get("packets", 0) > 1000, setup["background"]
        assert sent.get("packets", 0) >= got["packets"], setup["background"]  # (reported)
        # the rate it reached, in the CSV: near the target, never above it
        target = ex.BACKGROUND_SHARE * ex.LINK_RATE_MBIT
        assert 0.5 * target < r["background_mbit"] <= 1.01 * target, (r["background_mbit"], sent)
        # it stands for another machine's flow: not through h2's NIC-like bucket,
        # which carried the rank's packets only (fewer than the flow's)
        assert setup["host_egress"] == "shaped"
        assert r["host_queues"]["h2"]["packets"] < sent["packets"], r["host_queues"]
    else:
        assert r["train"]["collective"] == "ps" and "--collective" in setup["flags"]


def test_rows_name_the_code_they_were_measured_with(tmp_path: Path) -> None:
    import re
    import subprocess

    from testbed.results import code_revision

    root = Path(ex.__file__).resolve().parent.parent
    git = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                         text=True, check=False)  # fmt: skip
    if git.returncode == 0:  # a checkout git accepts: its commit, dirty or not
        assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", code_revision()), code_revision()
        assert git.stdout.startswith(code_revision()[:12])
    else:  # an unpacked tarball, say
        assert code_revision() == ""
    assert code_revision(tmp_path) == ""  # not a git checkout
    # a changed results file is a new measurement, not changed code
    work = tmp_path / "repo"
    (work / "results").mkdir(parents=True)
    (work / "code.py").write_text("x = 1\n")
    (work / "results" / "testbed.csv").write_text("a\n")
    for cmd in (["init", "-q"], ["add", "."],
                ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "c"]):
        subprocess.run(["git", "-C", str(work), *cmd], check=True, capture_output=True)
    clean = code_revision(work)
    (work / "results" / "testbed.csv").write_text("a\nb\n")
    assert code_revision(work) == clean and not clean.endswith("+dirty")
    (work / "code.py").write_text("x = 2\n")
    assert code_revision(work) == clean + "+dirty"
    assert {"finished_utc", "code_rev"} <= set(ex.CSV_FIELDS)


def test_ranks_get_their_hosts_share_of_the_machines_cpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each rank is alone on its host (LOCAL_WORLD_SIZE=1), but the hosts share this
    machine's CPUs: DLCP's automatic send threads are set from their share, unless
    DLCP_ENGINE_THREADS is set."""
    hosts = ["h1", "h2", "h3", "h4"]

    class Topology:
        host_names = hosts

        @staticmethod
        def leaf_of(host: str) -> str:
            return "leaf1"

    class Network:
        topology = Topology()

        @staticmethod
        def host_addr(host: str) -> str:
            return "10.0.0.1"

        @staticmethod
        def exec_argv(host: str, argv: list[str]) -> list[str]:
            return argv

    def threads_set(env: dict[str, str]) -> list[str]:
        cmds = ex._rank_commands(Network(), None, env, [], tmp_path / "out.json")  # type: ignore[arg-type]
        assert set(cmds) == set(range(4)) and all("LOCAL_WORLD_SIZE=1" in c for c in cmds.values())
        return [a for a in cmds[0] if a.startswith("DLCP_ENGINE_THREADS=")]

    monkeypatch.delenv("DLCP_ENGINE_THREADS", raising=False)
    for cpus, want in ((2, "1"), (8, "2"), (64, "2")):
        monkeypatch.setattr("os.sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert threads_set({}) == [f"DLCP_ENGINE_THREADS={want}"]
    assert threads_set({"DLCP_ENGINE_THREADS": "3"}) == ["DLCP_ENGINE_THREADS=3"]
    monkeypatch.setenv("DLCP_ENGINE_THREADS", "4")  # (the ranks inherit it)
    assert threads_set({}) == []
