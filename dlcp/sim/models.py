"""Per-layer gradient sizes of ResNet-50, VGG-16 and BERT-base, computed from
the architectures' layer shapes.

A *layer* here is what a training framework hands to the transport as one unit
of gradient: a convolution or linear layer together with its bias and the
normalisation that follows it. Sizes are parameter counts (fp32 gradients:
4 bytes each). Layers are listed front (input side) to back (output side).

Totals agree with the reference implementations: ResNet-50 25,557,032
parameters (torchvision), VGG-16 138,357,544 (torchvision), BERT-base
109,482,240 (Devlin et al., uncased vocabulary of 30,522, with pooler).

The tables are also stored as CSV files in ``dlcp/sim/data`` (written by
``python -m dlcp.sim.models``); :func:`load_layers` reads those and a test
checks that they match what this module computes.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError

__all__ = ["MODELS", "Layer", "compute_layers", "load_layers", "write_tables"]

DATA_DIR = Path(__file__).resolve().parent / "data"
MODELS = ("resnet50", "vgg16", "bert")


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    params: int

    @property
    def grad_bytes(self) -> int:
        return 4 * self.params


def _conv(cin: int, cout: int, k: int, *, bias: bool = False, bn: bool = True) -> int:
    return cin * cout * k * k + (cout if bias else 0) + (2 * cout if bn else 0)


def _resnet50() -> list[Layer]:
    out = [Layer("conv1", _conv(3, 64, 7))]
    cin = 64
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
        for b in range(blocks):
            pre = f"layer{stage + 1}.{b}"
            out.append(Layer(f"{pre}.conv1", _conv(cin, width, 1)))
            out.append(Layer(f"{pre}.conv2", _conv(width, width, 3)))
            out.append(Layer(f"{pre}.conv3", _conv(width, 4 * width, 1)))
            if b == 0:
                out.append(Layer(f"{pre}.downsample", _conv(cin, 4 * width, 1)))
            cin = 4 * width
    out.append(Layer("fc", 2048 * 1000 + 1000))
    return out


def _vgg16() -> list[Layer]:
    cfg = (64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512)
    out, cin, i = [], 3, 0
    for c in cfg:
        if c == 0:  # max-pool: no parameters
            continue
        out.append(Layer(f"features.conv{i}", _conv(cin, c, 3, bias=True, bn=False)))
        cin, i = c, i + 1
    for j, (a, b) in enumerate(((512 * 7 * 7, 4096), (4096, 4096), (4096, 1000))):
        out.append(Layer(f"classifier.fc{j}", a * b + b))
    return out


def _bert_base() -> list[Layer]:
    h, ff, vocab, pos, types, n_layers = 768, 3072, 30522, 512, 2, 12
    out = [Layer("embeddings", (vocab + pos + types) * h + 2 * h)]
    for i in range(n_layers):
        out.append(Layer(f"encoder.{i}.attention", 4 * (h * h + h) + 2 * h))
        out.append(Layer(f"encoder.{i}.ffn", (h * ff + ff) + (ff * h + h) + 2 * h))
    out.append(Layer("pooler", h * h + h))
    return out


_BUILDERS = {"resnet50": _resnet50, "vgg16": _vgg16, "bert": _bert_base}


def compute_layers(model: str) -> list[Layer]:
    """Layers of ``model`` (one of :data:`MODELS`), front to back."""
    try:
        return _BUILDERS[model]()
    except KeyError:
        raise UsageError(f"unknown model {model!r} (known: {', '.join(MODELS)})") from None


def load_layers(model: str) -> list[Layer]:
    """Layers of ``model`` from its CSV table in ``dlcp/sim/data``."""
    if model not in _BUILDERS:
        raise UsageError(f"unknown model {model!r} (known: {', '.join(MODELS)})")
    with (DATA_DIR / f"{model}.csv").open(newline="") as f:
        return [Layer(row["name"], int(row["params"])) for row in csv.DictReader(f)]


def write_tables(directory: Path = DATA_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for model in MODELS:
        with (directory / f"{model}.csv").open("w", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(["index", "name", "params"])
            for i, layer in enumerate(compute_layers(model)):
                w.writerow([i, layer.name, layer.params])


if __name__ == "__main__":
    write_tables(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA_DIR)
