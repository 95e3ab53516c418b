"""The simulation's pure-Python parts (no ns-3 needed): layer tables,
configuration errors, topology description and workload structure."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlcp.cli import main
from dlcp.sim import runner
from dlcp.sim.config import SimConfig, SimConfigError, switch_policy
from dlcp.sim.models import MODELS, compute_layers, load_layers
from dlcp.sim.runner import SimError
from dlcp.sim.topology import host_leaf_indices, leaf_spine
from dlcp.sim.workloads import build_workload

REFERENCE_PARAMS = {"resnet50": 25_557_032, "vgg16": 138_357_544, "bert": 109_482_240}


@pytest.mark.parametrize("model", MODELS)
def test_layer_tables_match_architectures(model: str) -> None:
    assert load_layers(model) == compute_layers(model)
    assert sum(layer.params for layer in load_layers(model)) == REFERENCE_PARAMS[model]


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"hosts": 100}, "hosts=100"),
        ({"workload": "ps-alexnet"}, "workload='ps-alexnet'"),
        ({"transport": "quic"}, "transport='quic'"),
        ({"disable": ("magic",)}, "'magic'"),
        ({"transport": "tcp", "disable": ("spray",)}, "disable"),
        ({"hosts": 16, "servers": 16}, "servers=16"),
        ({"p": 0.5}, "p=0.5"),
        ({"buffer_packets": 50, "drop_eligible_packets": 50}, "drop_eligible_packets"),
        ({"protocol": {"mtu": 10}}, "mtu"),
        # protocol settings the simulated endpoints do not model: refused, not ignored
        ({"protocol": {"reorder_grace": 0.01}}, "reorder_grace not simulated"),
        ({"protocol": {"classifier": "none"}}, "classifier='none' .only 'combined'."),
        ({"protocol": {"classifier_options": {"threshold": 3}}}, r"\['threshold'\]"),
        ({"protocol": {"pacer_options": {"burst_bytes": 1}}}, r"\['burst_bytes'\]"),
        ({"seed": 0}, "seed=0"),  # ns-3 refuses it deep inside the run
        ({"seed": -3}, "seed=-3"),
        ({"seed": 2**32}, "seed=4294967296"),
        ({"seed": 4294944443}, "seed=4294944443"),  # ns-3 refuses seeds >= its m2
        ({"servers": 2.5}, "servers=2.5"),
        ({"buffer_packets": 1}, "buffer_packets=1"),
    ],
)
def test_bad_config_names_the_parameter(kwargs: dict[str, object], names: str) -> None:
    with pytest.raises(SimConfigError, match=names.replace("(", r"\(")):
        SimConfig(**kwargs)  # type: ignore[arg-type]


def test_unknown_parameter_from_dict() -> None:
    with pytest.raises(SimConfigError, match="hostz"):
        SimConfig.from_dict({"hostz": 3})


def test_default_fabric_and_policy() -> None:
    cfg = SimConfig()
    assert (cfg.leaves, cfg.spines, cfg.fabric_gbps, cfg.effective_oversubscription) == (
        9, 4, 100.0, 4.0,
    )  # fmt: skip
    assert SimConfig(oversubscription=1.0).fabric_gbps == 400.0
    policy = switch_policy(cfg)
    assert (policy.queue_packets, policy.drop_eligible_packets, policy.n_classes) == (300, 60, 8)
    leaf_of, n_leaves, n_spines = host_leaf_indices(leaf_spine(cfg))
    assert (len(leaf_of), n_leaves, n_spines) == (144, 9, 4)
    assert leaf_of[15] == 0 and leaf_of[16] == 1


def test_parameter_server_workload_structure() -> None:
    cfg = SimConfig(hosts=16, hosts_per_leaf=8, spines=2, servers=2, iterations=2)
    wl = build_workload(cfg)
    assert len(wl.servers) == 2 and len(wl.workers) == 14
    assert {wl.servers[0] // 8, wl.servers[1] // 8} == {0, 1}  # one server per leaf
    push = [f for f in wl.flows if f.kind == "push" and f.iteration == 0]
    pull = [f for f in wl.flows if f.kind == "pull" and f.iteration == 0]
    assert len(push) == len(pull) and all(f.dst in wl.servers for f in push)
    # every worker pushes its whole (scaled) gradient once per iteration
    per_worker = sum(f.nbytes for f in push if f.src == wl.workers[0])
    assert abs(per_worker - 0.01 * wl.gradient_bytes) < 100
    assert all(f.p == cfg.p for f in push) and all(f.p == cfg.p_pull for f in pull)
    assert {f.cls for f in push} == set(range(8))


def test_ring_workload_structure() -> None:
    cfg = SimConfig(hosts=8, hosts_per_leaf=4, spines=2, workload="ring-vgg16", iterations=1)
    wl = build_workload(cfg)
    steps = {(f.src, f.dst) for f in wl.flows}
    assert steps == {(h, (h + 1) % 8) for h in range(8)}
    kinds = [f.kind for f in wl.flows]
    assert kinds.count("reduce-scatter") == kinds.count("all-gather")


def test_testbed_topology_file(tmp_path: Path) -> None:
    default = Path(__file__).resolve().parents[2] / "testbed" / "topologies" / "leaf_spine_4h.toml"
    cfg = SimConfig(hosts=4, hosts_per_leaf=2, spines=2, servers=1, topology=str(default))
    assert cfg.topology == str(default)
    with pytest.raises(SimConfigError, match="has 2 spines but spines=4"):
        SimConfig(hosts=4, hosts_per_leaf=2, servers=1, topology=str(default))
    with pytest.raises(SimConfigError, match="hosts_per_leaf=1"):
        SimConfig(hosts=4, hosts_per_leaf=1, spines=2, servers=1, topology=str(default))
    with pytest.raises(SimConfigError, match="has 4 hosts but hosts=8"):
        SimConfig(hosts=8, hosts_per_leaf=2, spines=2, servers=1, topology=str(default))
    # per-link settings are not simulated: refused rather than silently dropped
    eight = default.parent / "leaf_spine_8h.toml"
    with pytest.raises(SimConfigError, match=r"per-link \[\[links\]\] settings are not"):
        SimConfig(hosts=8, hosts_per_leaf=2, spines=3, servers=1, topology=str(eight))
    bad = tmp_path / "bad.toml"
    bad.write_text(
        'name = "x"\nleaves = ["l1"]\nspines = ["s1"]\n[hosts]\nh1 = { leaf = "l9" }\nh2 = "l1"\n'
    )
    with pytest.raises(SimConfigError, match="topology"):
        SimConfig(hosts=2, hosts_per_leaf=1, spines=1, servers=1, topology=str(bad))
    # hosts listed across the leaves: servers and ring neighbours would land elsewhere
    mixed = tmp_path / "mixed.toml"
    mixed.write_text(
        'name = "m"\nleaves = ["l1", "l2"]\nspines = ["s1", "s2"]\n[hosts]\n'
        'h1 = { leaf = "l1" }\nh2 = { leaf = "l2" }\nh3 = { leaf = "l1" }\nh4 = { leaf = "l2" }\n'
    )
    with pytest.raises(SimConfigError, match=r"host h2 .* is on l2.* list l1's hosts there"):
        SimConfig(hosts=4, hosts_per_leaf=2, spines=2, servers=2, topology=str(mixed))


def test_missing_ns3_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SimError, match=r"pip install 'dlcp\[sim\]'"):
        runner.require_ns3()
    assert main(["sim", "run", "--hosts", "16", "--hosts-per-leaf", "8", "--servers", "2"]) == 1


def test_cli_names_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "run", "--hosts", "100", "--hosts-per-leaf", "16"]) == 2
    assert "hosts=100" in capsys.readouterr().err
    assert main(["sim", "suite", "--workload", "ring-alexnet"]) == 2
    assert "ring-alexnet" in capsys.readouterr().err


def test_a_failed_message_is_neither_completed_nor_timed(tmp_path: Path) -> None:
    """A message its sender gave up on has an end time in the flows file, but it
    was not delivered: it is counted as failed, not in the FCTs, and its iteration
    has no time; a small loss bound survives the flows file's formatting."""
    from dlcp.sim.results import read_flows, summarize

    flows = tmp_path / "flows.csv"
    flows.write_text(
        "flow,src,dst,bytes,cls,p,group,start,end,lost_bytes,retx_pkts,failed\n"
        "0,1,0,1000,7,1e-05,0,0.000001,0.000011,0,0,0\n"
        "1,2,0,1000,7,1e-05,0,0.000001,0.000051,0,3,1\n"
        "2,1,0,1000,7,1e-05,1,0.000100,0.000120,0,0,0\n"
    )
    recs = read_flows(flows, ["push", "push", "push"], [0, 0, 1])
    s = summarize(recs)
    assert (s["messages"], s["completed"], s["failed"]) == (3, 2, 1)
    assert s["fct_max_us"] == pytest.approx(20.0)  # not the failed one's 50 us
    assert s["iteration_us"] == [pytest.approx(20.0)] and s["iterations_incomplete"] == 1
    assert recs[0]["p"] == 1e-05 and s["loss_fraction"] == 0.0


def test_runs_of_different_settings_get_different_names(tmp_path: Path) -> None:
    from dlcp.sim.runner import run_many, run_name

    assert run_name(SimConfig()) == "ps-resnet50_144h_dlcp_s1"  # the defaults: plain
    assert run_name(SimConfig(transport="dctcp", seed=2)) == "ps-resnet50_144h_dctcp_s2"
    others = [SimConfig(servers=72), SimConfig(scale=0.05), SimConfig(p=0.05),
              SimConfig(protocol={"pacer": "unpaced"})]  # fmt: skip
    names = {run_name(c) for c in others}
    assert len(names) == len(others)
    assert all(n.startswith("ps-resnet50_144h_dlcp_s1_") for n in names)
    with pytest.raises(SimConfigError, match="given twice"):
        run_many([SimConfig(servers=72), SimConfig(servers=72)], tmp_path)


@pytest.mark.parametrize(
    ("hosts", "per_leaf", "servers"),
    [(144, 16, 16), (16, 8, 1), (32, 16, 3), (100, 10, 11), (8, 4, 1), (2, 1, 1)],
)
def test_cli_defaults_fit_the_size_asked_for(hosts: int, per_leaf: int, servers: int) -> None:
    """``dlcp sim run --hosts 16`` failed on defaults fixed for 144 hosts ("servers=16:
    a parameter server needs 1..15 servers"); given only --hosts, the leaves and the
    servers follow it (144 keeps the fabric the published figures used)."""
    from dlcp.cli import _parser
    from dlcp.sim.cli import _base

    for command in ("run", "suite"):
        args = _parser().parse_args(["sim", command, "--hosts", str(hosts)])
        cfg = SimConfig(**_base(args, "ps-resnet50"))
        assert (cfg.hosts, cfg.hosts_per_leaf, cfg.servers) == (hosts, per_leaf, servers)
        assert cfg.hosts // cfg.hosts_per_leaf >= 2


def test_cli_options_given_still_win() -> None:
    from dlcp.cli import _parser
    from dlcp.sim.cli import _base

    argv = ["sim", "run", "--hosts", "16", "--hosts-per-leaf", "4", "--servers", "3"]
    cfg = SimConfig(**_base(_parser().parse_args(argv), "ps-resnet50"))
    assert (cfg.hosts_per_leaf, cfg.servers) == (4, 3)
