"""Per-chunk classification: priority class, drop eligibility, magnitude class.

The packetizer cuts a message into chunks (one per data packet) and asks a
:class:`Classifier` for three tags per chunk, carried in the traffic-class byte
of the data header (see :func:`dlcp.proto.wire.pack_tclass`):

* ``prio`` -- priority class ``0..n_classes-1`` (at most 8 classes); the
  **highest class is the most urgent**, 0 the least. Switches serve classes
  from strict-priority queues.
* ``drop`` -- ``True`` when the chunk is drop-eligible: under congestion a
  switch drops these first, and the receiver's loss bound absorbs them.
* ``mag`` -- a 4-bit magnitude class from :func:`magnitude_class`.

Policies, chosen by name through :func:`make_classifier`:

``"layer"``      priority from the layer's position; nothing drop-eligible.
``"magnitude"``  drop eligibility from gradient magnitude; one priority class.
``"combined"``   priority from the layer, drop eligibility from magnitude,
                 chunks of protected layers never drop-eligible.
``"none"``       one class, everything protected.

Layer 0 is the input-side (front) layer. Which end goes first is configurable
(``front_first``), because the front layers are needed first by the next
forward pass while the back layers are less loss-tolerant.

Rules of this module (it is part of the sans-I/O core):

* no I/O, no clock, no randomness, no threads; pure functions of their inputs;
* every per-chunk computation is vectorised with numpy (no Python loop over
  chunks), or done by a C kernel of :mod:`.kernels` that gives the same result;
* bad input raises :class:`ValueError` naming the argument and the value.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, NamedTuple, Protocol, TypeAlias, TypeVar, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..errors import UsageError
from . import kernels
from .chunk_layers import MAX_LAYERS

__all__ = [
    "MAX_CLASSES",
    "ChunkClasses",
    "ChunkRule",
    "Classifier",
    "CombinedClassifier",
    "KernelRule",
    "LayerClassifier",
    "MagnitudeClassifier",
    "NoneClassifier",
    "available_classifiers",
    "classify_chunks",
    "classify_uint16_f32",
    "kernel_rule",
    "magnitude_class",
    "make_classifier",
    "register_classifier",
]

#: priority classes a data header can carry (3 bits)
MAX_CLASSES: Final = 8
#: ``floor(log2(m)) + _MAG_BIAS`` is the magnitude class before clamping
_MAG_BIAS: Final = 20
_MAG_MAX: Final = 15
#: drop fraction of the combined policy when neither mode is given
_DEFAULT_DROP_FRACTION: Final = 0.1


@dataclass(frozen=True, slots=True)
class ChunkClasses:
    """The tags of each chunk of one message (all arrays have one entry per chunk)."""

    prio: NDArray[np.uint8]
    """priority class ``0..n_classes-1``; the highest is the most urgent"""
    drop: NDArray[np.bool_]
    """``True`` = drop-eligible"""
    mag: NDArray[np.uint8]
    """magnitude class ``0..15`` (:func:`magnitude_class`)"""

    def __post_init__(self) -> None:
        n = len(self.prio)
        if len(self.drop) != n or len(self.mag) != n:
            raise UsageError(
                f"ChunkClasses arrays differ in length: prio={n}, drop={len(self.drop)}, "
                f"mag={len(self.mag)}"
            )

    def __len__(self) -> int:
        return len(self.prio)


class Classifier(Protocol):
    """A per-chunk classification policy."""

    def classify(
        self, layers: NDArray[np.integer], magnitudes: NDArray[np.float32], *, n_layers: int
    ) -> ChunkClasses:
        """Tags for chunks whose layers are ``layers`` (each in ``0..n_layers-1``) and
        whose estimated gradient magnitudes are ``magnitudes``."""
        ...


# --------------------------------------------------------------------------- helpers


def magnitude_class(magnitudes: ArrayLike) -> NDArray[np.uint8]:
    """4-bit magnitude class: ``clamp(floor(log2(|m|)) + 20, 0, 15)``.

    Magnitudes are non-negative by contract (a sum of ``|g|`` over a sample of
    the chunk); a negative value is classed by its absolute value. ``0`` is
    class 0 and ``+-inf`` is class 15. **NaN is class 15**: a chunk whose sample
    holds a NaN is treated as the largest, so magnitude policies protect it and
    the receiver sees the NaN instead of having it silently dropped.
    """
    m = np.asarray(magnitudes)
    if kernels.ACCELERATED and m.dtype == np.float32 and m.ndim == 1:
        return kernels.magnitude_class_f32(m, _MAG_BIAS, _MAG_MAX)  # (the same, in C)
    m = np.abs(m)
    if m.dtype.kind != "f":  # (np.issubdtype costs microseconds)
        m = m.astype(np.float64)
    # frexp: m = f * 2**e with f in [0.5, 1), so floor(log2(m)) = e - 1 exactly, in
    # the magnitudes' own precision (0, inf and NaN give e = 0: fixed up below)
    _, e = np.frexp(m)
    # (np.minimum of np.maximum: np.clip costs several times as much on small arrays)
    biased = np.maximum(e + (_MAG_BIAS - 1), 0)
    out: NDArray[np.uint8] = np.minimum(biased, _MAG_MAX).astype(np.uint8)
    out[~(m > 0)] = 0  # 0 (and NaN, set next)
    out[~np.isfinite(m)] = _MAG_MAX  # +-inf and NaN
    return out


def _check_inputs(
    layers: NDArray[np.integer], magnitudes: NDArray[np.float32], n_layers: int
) -> tuple[NDArray[np.int64], NDArray[np.floating]]:
    lay = np.asarray(layers)
    mag = np.asarray(magnitudes)
    if lay.ndim != 1 or mag.ndim != 1:
        raise UsageError(
            f"layers and magnitudes must be 1-D, got shapes {lay.shape} and {mag.shape}"
        )
    if len(lay) != len(mag):
        raise UsageError(
            f"layers and magnitudes differ in length: {len(lay)} layers, {len(mag)} magnitudes"
        )
    if lay.size and lay.dtype.kind not in "iu":  # (np.issubdtype costs microseconds)
        raise UsageError(f"layers must be integers, got dtype {lay.dtype}")
    if not 1 <= n_layers <= MAX_LAYERS:
        raise UsageError(f"n_layers={n_layers} outside 1..{MAX_LAYERS}")
    lay64 = lay.astype(np.int64, copy=False)
    if lay64.size:
        lo, hi = int(lay64.min()), int(lay64.max())
        if lo < 0 or hi >= n_layers:
            bad = lo if lo < 0 else hi
            raise UsageError(f"layer {bad} outside 0..{n_layers - 1} (n_layers={n_layers})")
    if mag.dtype.kind != "f":
        mag = mag.astype(np.float64)
    return lay64, mag


def _check_classes(n_classes: int) -> None:
    if isinstance(n_classes, bool) or not isinstance(n_classes, int | np.integer):
        raise UsageError(f"n_classes={n_classes!r} must be an integer")
    if not 1 <= n_classes <= MAX_CLASSES:
        raise UsageError(f"n_classes={n_classes} outside 1..{MAX_CLASSES}")


def _check_prio(prio: int, n_classes: int = MAX_CLASSES) -> None:
    if isinstance(prio, bool) or not isinstance(prio, int | np.integer):
        raise UsageError(f"prio={prio!r} must be an integer")
    if not 0 <= prio < n_classes:
        raise UsageError(f"prio={prio} outside 0..{n_classes - 1}")


def _layer_prio(
    layers: NDArray[np.int64], n_layers: int, n_classes: int, front_first: bool
) -> NDArray[np.uint8]:
    """``floor(layer * n_classes / n_layers)``, reversed so that front layers are
    the highest class when ``front_first``."""
    # one entry per layer, then one gather: cheaper than the arithmetic per chunk
    return _layer_prio_table(n_layers, n_classes, front_first)[layers]


@functools.lru_cache(maxsize=64)
def _layer_prio_table(n_layers: int, n_classes: int, front_first: bool) -> NDArray[np.uint8]:
    """The class of each layer (read-only: shared between calls)."""
    band = np.clip(np.arange(n_layers, dtype=np.int64) * n_classes // n_layers, 0, n_classes - 1)
    table = ((n_classes - 1 - band) if front_first else band).astype(np.uint8)
    table.flags.writeable = False
    return table


def _smallest(key: NDArray[np.floating], k: int) -> NDArray[np.bool_]:
    """Mask of the ``k`` smallest entries of ``key``; ties go to the lower index.

    ``O(n)``: one partition finds the k-th value, everything strictly below it
    is taken, and the remaining places go to the first entries equal to it.
    """
    out = np.zeros(len(key), dtype=np.bool_)
    if k <= 0:
        return out
    if k >= len(key):
        out[:] = True
        return out
    kth = np.partition(key, k - 1)[k - 1]
    below = key < kth
    out |= below
    need = k - int(np.count_nonzero(below))
    out[np.flatnonzero(key == kth)[:need]] = True
    return out


def _magnitude_drop(
    magnitudes: NDArray[np.floating],
    eligible: NDArray[np.bool_] | None,
    drop_fraction: float | None,
    threshold: float | None,
) -> NDArray[np.bool_]:
    """Drop mask by magnitude among ``eligible`` chunks (all when None).

    NaN magnitudes are never drop-eligible. The threshold is compared in the
    magnitudes' own precision, so a float32 magnitude equal to ``float32(t)``
    is not below ``t``.
    """
    key = np.abs(magnitudes)
    base = np.ones(len(key), dtype=np.bool_) if eligible is None else eligible
    if threshold is not None:
        with np.errstate(over="ignore"):  # a huge t in float16 is +inf: all finite below
            t = np.asarray(threshold, dtype=key.dtype)
        below: NDArray[np.bool_] = key < t  # NaN < t is False
        return base & below
    q = drop_fraction if drop_fraction is not None else 0.0
    nan = np.isnan(key)
    if eligible is None and not nan.any():  # the usual case: rank all chunks directly
        return _smallest(key, int(np.floor(q * len(key))))
    k = int(np.floor(q * int(np.count_nonzero(base))))
    idx = np.flatnonzero(base & ~nan)
    drop = np.zeros(len(key), dtype=np.bool_)
    drop[idx[_smallest(key[idx], k)]] = True
    return drop


def _check_drop_mode(drop_fraction: float | None, threshold: float | None) -> None:
    if drop_fraction is not None and threshold is not None:
        raise UsageError(
            f"give drop_fraction or threshold, not both (drop_fraction={drop_fraction}, "
            f"threshold={threshold})"
        )
    if drop_fraction is not None and not 0.0 <= drop_fraction < 1.0:
        raise UsageError(f"drop_fraction={drop_fraction} outside [0, 1)")
    if threshold is not None and not (threshold >= 0.0 and np.isfinite(threshold)):
        raise UsageError(f"threshold={threshold} must be a finite magnitude >= 0")


# --------------------------------------------------------------------------- registry

_C = TypeVar("_C", bound=Callable[..., Classifier])
_REGISTRY: dict[str, Callable[..., Classifier]] = {}


def register_classifier(name: str) -> Callable[[_C], _C]:
    """Class decorator: make a classifier constructible by ``name``.

    The factory's keyword parameters are the policy's options.
    """
    if not name or not isinstance(name, str):
        raise UsageError(f"classifier name must be a non-empty string, got {name!r}")

    def deco(factory: _C) -> _C:
        if name in _REGISTRY:
            raise UsageError(f"a classifier named {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return deco


def available_classifiers() -> list[str]:
    """Registered classifier names, sorted."""
    return sorted(_REGISTRY)


def make_classifier(name: str, **options: object) -> Classifier:
    """A classifier by registered name, with its options.

    Raises :class:`ValueError` for an unknown name (listing the known ones), an
    unknown option (listing the valid ones) or an invalid option value.
    """
    try:
        factory = _REGISTRY[name]
    except KeyError:
        known = ", ".join(available_classifiers())
        raise UsageError(f"unknown classifier {name!r}; known classifiers: {known}") from None
    params = inspect.signature(factory).parameters
    valid = [p for p, spec in params.items() if spec.kind is not inspect.Parameter.VAR_KEYWORD]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise UsageError(
            f"classifier {name!r} has no option {', '.join(map(repr, unknown))}; "
            f"its options: {', '.join(valid) or '(none)'}"
        )
    try:
        return factory(**options)
    except TypeError as exc:  # e.g. a wrong type reaching a comparison
        raise UsageError(f"bad option for classifier {name!r}: {exc}") from exc


# --------------------------------------------------------------------------- policies


@register_classifier("layer")
@dataclass(frozen=True, slots=True)
class LayerClassifier:
    """Priority from layer position, nothing drop-eligible.

    ``prio = n_classes - 1 - floor(layer * n_classes / n_layers)`` with
    ``front_first`` (layer 0, the input side, is the most urgent), and
    ``floor(layer * n_classes / n_layers)`` without.
    """

    n_classes: int = MAX_CLASSES
    front_first: bool = True

    def __post_init__(self) -> None:
        _check_classes(self.n_classes)

    def chunk_rule(self, n_layers: int) -> ChunkRule:
        """This rule as data, for :func:`classify_chunks`."""
        return ChunkRule(_layer_prio_table(n_layers, self.n_classes, self.front_first), None, 0.0)

    def classify(
        self, layers: NDArray[np.integer], magnitudes: NDArray[np.float32], *, n_layers: int
    ) -> ChunkClasses:
        lay, mag = _check_inputs(layers, magnitudes, n_layers)
        return ChunkClasses(
            prio=_layer_prio(lay, n_layers, self.n_classes, self.front_first),
            drop=np.zeros(len(lay), dtype=np.bool_),
            mag=magnitude_class(mag),
        )


@register_classifier("magnitude")
@dataclass(frozen=True, slots=True)
class MagnitudeClassifier:
    """Drop eligibility from magnitude; every chunk gets priority class ``prio``.

    Exactly one mode (``drop_fraction`` 0 when neither is given):

    * ``drop_fraction=q``: the ``floor(q * n)`` chunks of smallest magnitude are
      drop-eligible, ties going to the lower chunk index;
    * ``threshold=t``: chunks with magnitude ``< t`` are drop-eligible.

    NaN magnitudes count as the largest, so they are never drop-eligible.
    """

    drop_fraction: float | None = None
    threshold: float | None = None
    prio: int = 0

    def __post_init__(self) -> None:
        _check_drop_mode(self.drop_fraction, self.threshold)
        _check_prio(self.prio)
        if self.drop_fraction is None and self.threshold is None:
            object.__setattr__(self, "drop_fraction", 0.0)

    def chunk_rule(self, n_layers: int) -> ChunkRule:
        """This rule as data, for :func:`classify_chunks`."""
        prio = np.full(n_layers, self.prio, dtype=np.uint8)
        return ChunkRule(prio, None, self.drop_fraction, self.threshold)

    def classify(
        self, layers: NDArray[np.integer], magnitudes: NDArray[np.float32], *, n_layers: int
    ) -> ChunkClasses:
        lay, mag = _check_inputs(layers, magnitudes, n_layers)
        return ChunkClasses(
            prio=np.full(len(lay), self.prio, dtype=np.uint8),
            drop=_magnitude_drop(mag, None, self.drop_fraction, self.threshold),
            mag=magnitude_class(mag),
        )


@register_classifier("combined")
@dataclass(frozen=True, slots=True)
class CombinedClassifier:
    """Priority from the layer (as :class:`LayerClassifier`), drop eligibility from
    magnitude (as :class:`MagnitudeClassifier`), except that chunks of
    ``protect_layers`` are never drop-eligible.

    With ``drop_fraction=q`` the fraction applies to the chunks that may be
    dropped at all: the ``floor(q * m)`` smallest of the ``m`` chunks outside the
    protected layers are drop-eligible. ``drop_fraction`` is 0.1 unless
    ``threshold`` is given instead (giving both is an error).
    """

    n_classes: int = MAX_CLASSES
    front_first: bool = True
    drop_fraction: float | None = None
    threshold: float | None = None
    protect_layers: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        _check_classes(self.n_classes)
        _check_drop_mode(self.drop_fraction, self.threshold)
        if self.drop_fraction is None and self.threshold is None:
            object.__setattr__(self, "drop_fraction", _DEFAULT_DROP_FRACTION)
        try:
            protect = frozenset(int(x) for x in self.protect_layers)
        except (TypeError, ValueError):
            raise UsageError(
                f"protect_layers={self.protect_layers!r} must be a set of layer numbers"
            ) from None
        if any(x < 0 for x in protect):
            raise UsageError(f"protect_layers={sorted(protect)} holds a negative layer")
        object.__setattr__(self, "protect_layers", protect)

    def chunk_rule(self, n_layers: int) -> ChunkRule:
        """This rule as data, for :func:`classify_chunks`."""
        eligible = None
        if self.protect_layers:
            eligible = np.ones(n_layers, dtype=np.bool_)
            eligible[[x for x in self.protect_layers if x < n_layers]] = False
        prio = _layer_prio_table(n_layers, self.n_classes, self.front_first)
        return ChunkRule(prio, eligible, self.drop_fraction, self.threshold)

    def classify(
        self, layers: NDArray[np.integer], magnitudes: NDArray[np.float32], *, n_layers: int
    ) -> ChunkClasses:
        lay, mag = _check_inputs(layers, magnitudes, n_layers)
        eligible: NDArray[np.bool_] | None = None
        if self.protect_layers:
            protected = np.fromiter(self.protect_layers, dtype=np.int64)
            eligible = ~np.isin(lay, protected)
        return ChunkClasses(
            prio=_layer_prio(lay, n_layers, self.n_classes, self.front_first),
            drop=_magnitude_drop(mag, eligible, self.drop_fraction, self.threshold),
            mag=magnitude_class(mag),
        )


@register_classifier("none")
@dataclass(frozen=True, slots=True)
class NoneClassifier:
    """One priority class (0), nothing drop-eligible."""

    def chunk_rule(self, n_layers: int) -> ChunkRule:
        """This rule as data, for :func:`classify_chunks`."""
        return ChunkRule(np.zeros(n_layers, dtype=np.uint8), None, 0.0)

    def classify(
        self, layers: NDArray[np.integer], magnitudes: NDArray[np.float32], *, n_layers: int
    ) -> ChunkClasses:
        lay, mag = _check_inputs(layers, magnitudes, n_layers)
        return ChunkClasses(
            prio=np.zeros(len(lay), dtype=np.uint8),
            drop=np.zeros(len(lay), dtype=np.bool_),
            mag=magnitude_class(mag),
        )


# --------------------------------------------------------------------------- in C


@dataclass(frozen=True, slots=True, eq=False)
class ChunkRule:
    """A built-in classifier's rule for a message of ``n_layers`` layers, as data
    that the C kernel applies in one pass (:func:`classify_chunks`); the
    classifier's ``classify`` stays the reference it is held to."""

    #: the priority class of each layer
    layer_prio: NDArray[np.uint8]
    #: the layers whose chunks may be drop-eligible (None: all)
    layer_eligible: NDArray[np.bool_] | None
    #: drop eligibility by fraction, or (None) by ``threshold``
    drop_fraction: float | None
    threshold: float | None = None


#: the classifiers whose rule the C kernel applies (exactly these types: a subclass
#: may classify otherwise)
_RULED: Final = (LayerClassifier, MagnitudeClassifier, CombinedClassifier, NoneClassifier)
_Ruled: TypeAlias = LayerClassifier | MagnitudeClassifier | CombinedClassifier | NoneClassifier


def classify_chunks(
    classifier: Classifier,
    layers: NDArray[np.integer],
    magnitudes: NDArray[np.float32],
    *,
    n_layers: int,
    may_drop: bool = True,
) -> ChunkClasses:
    """``classifier.classify(layers, magnitudes, n_layers=n_layers)``, with no chunk
    drop-eligible unless ``may_drop``. For the built-in classifiers, with the C
    accelerator, uint16 layers and float32 magnitudes (as
    :func:`.packetizer.plan_message` has them), one C pass gives the same tags
    without numpy's temporaries, and without ranking the magnitudes when nothing
    may be dropped."""
    if (
        type(classifier) in _RULED
        and kernels.ACCELERATED
        and layers.dtype == np.uint16
        and magnitudes.dtype == np.float32
        and 1 <= n_layers <= MAX_LAYERS
    ):
        rule = _kernel_rule(cast(_Ruled, classifier), n_layers)
        tags = kernels.classify_chunks(
            cast("NDArray[np.uint16]", layers), n_layers, magnitudes, rule.layer_prio,
            rule.layer_eligible, rule.fraction, rule.threshold, may_drop, rule.bias, rule.top,
        )  # fmt: skip
        if tags is not None:
            return ChunkClasses(*tags)
        # a layer outside 0..n_layers-1: classify says so, in the user's words
    classes = classifier.classify(layers, magnitudes, n_layers=n_layers)
    if may_drop:
        return classes
    return ChunkClasses(classes.prio, np.zeros_like(classes.drop), classes.mag)


def classify_uint16_f32(
    classifier: Classifier,
    layers: NDArray[np.uint16],
    magnitudes: NDArray[np.float32],
    *,
    n_layers: int,
    may_drop: bool,
) -> tuple[NDArray[np.uint8], NDArray[np.bool_], NDArray[np.uint8]] | None:
    """:func:`classify_chunks`' C pass as (prio, drop, mag), for the arrays
    :func:`~dlcp.proto.packetizer.plan_message` makes (contiguous uint16 layers
    and float32 magnitudes, which the kernel checks), without the checks and the
    :class:`ChunkClasses` around it; None where that pass does not apply (another
    classifier, no accelerator, a layer not below ``n_layers``): then
    :func:`classify_chunks` classifies, or says what is wrong."""
    rule = kernel_rule(classifier, n_layers)
    if rule is None:
        return None
    return kernels.classify_chunks(
        layers, n_layers, magnitudes, rule.layer_prio, rule.layer_eligible, rule.fraction,
        rule.threshold, may_drop, rule.bias, rule.top, convert=False,
    )  # fmt: skip


class KernelRule(NamedTuple):
    """A built-in classifier's :class:`ChunkRule` as the C kernels take it
    (``classify_chunks``, ``plan_send``)."""

    layer_prio: NDArray[np.uint8]
    layer_eligible: NDArray[np.uint8] | None
    #: the drop fraction, -1.0 where the rule drops by threshold
    fraction: float
    #: the threshold in float32, as the reference compares it
    threshold: float
    #: the magnitude class's bias and largest value (:func:`magnitude_class`)
    bias: int
    top: int


def kernel_rule(classifier: Classifier, n_layers: int) -> KernelRule | None:
    """``classifier``'s rule for a message of ``n_layers`` layers as the C kernels
    take it; None where they do not apply (another classifier, no accelerator,
    a number of layers outside 1..MAX_LAYERS)."""
    if type(classifier) not in _RULED or not kernels.ACCELERATED or not 1 <= n_layers <= MAX_LAYERS:
        return None
    return _kernel_rule(cast(_Ruled, classifier), n_layers)


@functools.lru_cache(maxsize=64)
def _kernel_rule(classifier: _Ruled, n_layers: int) -> KernelRule:
    rule = classifier.chunk_rule(n_layers)
    eligible = None if rule.layer_eligible is None else rule.layer_eligible.view(np.uint8)
    for table in (rule.layer_prio, eligible):  # (shared by every call: read-only)
        if table is not None:
            table.flags.writeable = False
    if rule.drop_fraction is not None:
        fraction, threshold = float(rule.drop_fraction), 0.0
    else:
        with np.errstate(over="ignore"):  # a huge threshold is +inf in float32
            fraction, threshold = -1.0, float(np.float32(rule.threshold))
    return KernelRule(rule.layer_prio, eligible, fraction, threshold, _MAG_BIAS, _MAG_MAX)
