"""``dlcp train-demo``: the main job. Digits CNN on N local ranks, DLCP then Gloo.

Runs ``examples/train_digits.py`` (a script of the source tree, run by path) twice
through :func:`dlcp.launch.launch`: first over DLCP (the comm hook, bounded loss
``p``, ``loss`` of the received data datagrams dropped by the endpoints' in-process
loss EMULATOR), then over Gloo (plain DDP, no emulated loss: Gloo's TCP would only
retransmit). Each run writes its per-epoch figures to
``<results>/digits_<transport>.json``; this module prints them side by side and
plots them to ``<results>/digits_dlcp_vs_gloo.png``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from .errors import DLCPError
from .launch import launch

__all__ = ["ExampleMissing", "example_script", "figure", "main", "plot"]

PNG_NAME = "digits_dlcp_vs_gloo.png"

#: examples/ beside this package in the source tree: scripts, not installed
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


class ExampleMissing(DLCPError, FileNotFoundError):
    """The example script is not there (an install without the source tree)."""


def example_script(name: str) -> Path:
    """The path of ``examples/<name>``, run by path; it comes with the source tree
    (``pip install -e .``), not with an installed wheel."""
    path = EXAMPLES / name
    if not path.is_file():
        raise ExampleMissing(
            f"examples/{name} not found at {path}: it is a script of DLCP's source tree, "
            "run from a checkout (pip install -e .)"
        )
    return path


def _run(
    transport: str, nproc: int, epochs: int, p: float, loss: float, collective: str, out: Path
) -> dict[str, Any] | int:
    path = out / f"digits_{transport}.json"
    path.unlink(missing_ok=True)
    env = dict(os.environ)
    env.pop("DLCP_EMULATED_LOSS", None)
    args = ["--transport", transport, "--epochs", str(epochs), "--json", str(path)]
    if transport == "dlcp":
        env["DLCP_EMULATED_LOSS"] = repr(loss)
        args += ["--p", repr(p), "--collective", collective]
        if collective == "ps":  # a PS-style all-reduce, as Gloo's run is an all-reduce
            args += ["--ps-servers", "all"]
    what = (
        f"DLCP ({collective} all-reduce, p = {p:g}, {100 * loss:.3g}% EMULATED loss of received "
        f"data datagrams, {_engine(env)} engine)"
        if transport == "dlcp"
        else "Gloo (TCP, no loss)"
    )
    print(f"\n== {nproc} ranks over {what}", flush=True)
    cmd = [sys.executable, "-u", str(example_script("train_digits.py")), *args]
    result = launch(cmd, nproc, env=env)
    if result.returncode != 0:
        print(f"dlcp train-demo: {transport} run failed: {result.message}", file=sys.stderr)
        return result.returncode
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _engine(env: dict[str, str]) -> str:
    """The engine the ranks will send with (``DLCP_ENGINE``, this build)."""
    from .io.config import EndpointConfig
    from .io.engine import choose_engine

    config = EndpointConfig.from_env(env)
    return choose_engine(config.engine, authenticate=config.protocol.authenticate)


def _summary(dlcp: dict[str, Any], gloo: dict[str, Any]) -> str:
    lines = [
        "",
        "epoch | DLCP acc  ms/iter  lost   retx | Gloo acc  ms/iter",
        "------+--------------------------------+------------------",
    ]
    for d, g in zip(dlcp["epochs"], gloo["epochs"], strict=True):
        lines.append(
            f"{d['epoch']:5d} | {d['test_accuracy']:6.1f}%  {1e3 * d['iter_s']:7.1f}  "
            f"{100 * d['loss_fraction']:4.2f}%  {d['retransmitted_packets']:4d} | "
            f"{g['test_accuracy']:6.1f}%  {1e3 * g['iter_s']:7.1f}"
        )
    return "\n".join(lines)


def plot(dlcp: dict[str, Any], gloo: dict[str, Any], path: Path) -> None:
    """Accuracy, time per iteration and DLCP's loss per epoch, DLCP against Gloo."""
    import matplotlib.pyplot as plt

    fig = figure(dlcp, gloo)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(dlcp: dict[str, Any], gloo: dict[str, Any]) -> Any:
    """The figure :func:`plot` saves: accuracy, time per iteration, and DLCP's loss
    per epoch drawn under its bound ``p`` (no message may lose more, so neither may
    an epoch's total)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep_d = [e["epoch"] for e in dlcp["epochs"]]
    ep_g = [e["epoch"] for e in gloo["epochs"]]
    label_d = (
        f"DLCP ({dlcp['collective']}, p={dlcp['p']:g}, "
        f"{100 * dlcp['emulated_loss']:.3g}% emul. loss)"
    )
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), layout="constrained")
    ax = axes[0]
    ax.plot(ep_d, [e["test_accuracy"] for e in dlcp["epochs"]], "o-", label=label_d)
    ax.plot(ep_g, [e["test_accuracy"] for e in gloo["epochs"]], "s--", label="Gloo (no loss)")
    ax.set(title="Test accuracy", xlabel="epoch", ylabel="accuracy (%)")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    ax = axes[1]
    ax.plot(ep_d, [1e3 * e["iter_s"] for e in dlcp["epochs"]], "o-", label="DLCP")
    ax.plot(ep_g, [1e3 * e["iter_s"] for e in gloo["epochs"]], "s--", label="Gloo")
    ax.set(title="Time per iteration (mean over ranks)", xlabel="epoch", ylabel="ms")
    ax.set_ylim(bottom=0)
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[2]
    lost = [100 * e["loss_fraction"] for e in dlcp["epochs"]]
    bars = ax.bar(ep_d, lost, color="tab:blue", alpha=0.75)
    ax.bar_label(
        bars,
        labels=[f"{e['retransmitted_packets']}" for e in dlcp["epochs"]],
        fontsize=8,
        padding=2,
    )
    bound = 100 * dlcp["p"]
    ax.axhline(
        bound, color="tab:red", linestyle="--", label=f"loss bound p = {bound:g}% per message"
    )
    ax.set(
        title=f"DLCP: elements lost (p = {bound:g}% per message)",
        xlabel="epoch  (numbers: packets retransmitted)",
        ylabel="% of all ranks' elements, zero-filled",
    )
    ax.set_ylim(0, max([*lost, bound], default=0.0) * 1.3 or 1.0)
    ax.legend(loc="upper right")
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"Digits CNN, {dlcp['world_size']} local ranks, data-parallel: DLCP vs Gloo")
    return fig


def main(
    *,
    nproc: int = 4,
    epochs: int = 8,
    p: float = 0.05,
    loss: float = 0.01,
    collective: str = "ring",
    results: str = "results",
) -> int:
    from .settings import check_env

    # the ranks' DLCP_* variables (the loss is --loss), checked once here
    wrong = check_env({k: v for k, v in os.environ.items() if k != "DLCP_EMULATED_LOSS"})
    if wrong is not None:
        print(f"dlcp train-demo: {wrong}", file=sys.stderr)
        return 2
    out = Path(results)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"dlcp train-demo: cannot use --results {results}: {exc}", file=sys.stderr)
        return 2
    try:
        example_script("train_digits.py")
    except ExampleMissing as exc:
        print(f"dlcp train-demo: {exc}", file=sys.stderr)
        return 2
    runs: dict[str, dict[str, Any]] = {}
    for transport in ("dlcp", "gloo"):
        got = _run(transport, nproc, epochs, p, loss, collective, out)
        if isinstance(got, int):
            return got
        runs[transport] = got
    print(_summary(runs["dlcp"], runs["gloo"]))
    png = out / PNG_NAME
    plot(runs["dlcp"], runs["gloo"], png)
    d, g = runs["dlcp"]["epochs"][-1], runs["gloo"]["epochs"][-1]
    print(
        f"\nfinal test accuracy: DLCP {d['test_accuracy']:.1f}%, Gloo {g['test_accuracy']:.1f}%"
        f"\nJSON: {out / 'digits_dlcp.json'}, {out / 'digits_gloo.json'}\nplot: {png}",
        flush=True,
    )
    return 0
