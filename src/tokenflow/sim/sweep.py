"""Sweep one or two config keys over a grid and name the best point.

A spec is ``"section.key=v1,v2,..."``; the key may be a simulator key
(``hardware.inference_gpus``) or a training key that maps onto one (``rollout.max_staleness``).
Every grid point is the base layers plus one more layer holding the point's values, so a point
is validated exactly like a config file; a point that does not validate (say, every GPU given
to inference) is kept with its error and skipped when picking the best.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from tokenflow.config.loading import parse_value
from tokenflow.sim.loading import ConfigError, load_layers, set_dotted
from tokenflow.sim.metrics import SimResult
from tokenflow.sim.pipeline import simulate

log = logging.getLogger(__name__)


@dataclass
class SweepAxis:
    key: str
    values: list[Any]


@dataclass
class SweepPoint:
    values: tuple
    result: SimResult | None = None
    error: str | None = None


@dataclass
class SweepResult:
    axes: list[SweepAxis]
    objective: str
    points: list[SweepPoint] = field(default_factory=list)

    @property
    def best(self) -> SweepPoint | None:
        ok = [p for p in self.points if p.result is not None]
        return max(ok, key=lambda p: getattr(p.result, self.objective)) if ok else None

    def to_dict(self) -> dict:
        best = self.best
        return {
            "axes": [{"key": a.key, "values": a.values} for a in self.axes],
            "objective": self.objective,
            "best": None if best is None else dict(zip([a.key for a in self.axes], best.values)),
            "points": [{"values": dict(zip([a.key for a in self.axes], p.values)),
                        "result": p.result.to_dict() if p.result else None, "error": p.error}
                       for p in self.points],
        }


def parse_spec(spec: str) -> SweepAxis:
    """``"section.key=v1,v2"`` -> axis; values are read as TOML scalars."""
    key, sep, values = spec.partition("=")
    key = key.strip()
    if not sep or "." not in key or not values.strip():
        raise ConfigError(f"sweep {spec!r}: expected section.key=v1,v2,...")
    return SweepAxis(key, [parse_value(v.strip()) for v in values.split(",") if v.strip()])


def run_sweep(base_layers: list[tuple[str, dict]], specs: list[str],
              objective: str = "tokens_per_s") -> SweepResult:
    """Simulate every point of the grid spanned by one or two ``specs``."""
    if not 1 <= len(specs) <= 2:
        raise ConfigError(f"a sweep takes one or two specs, got {len(specs)}")
    axes = [parse_spec(s) for s in specs]
    out = SweepResult(axes=axes, objective=objective)
    for values in itertools.product(*(a.values for a in axes)):
        point_layer: dict = {}
        for axis, v in zip(axes, values):
            set_dotted(point_layer, axis.key, v)
        label = ", ".join(f"{a.key}={v}" for a, v in zip(axes, values))
        try:
            cfg = load_layers([*base_layers, (f"sweep point {label}", point_layer)])
        except ConfigError as e:
            log.warning("sweep point %s skipped: %s", label, str(e).splitlines()[0])
            out.points.append(SweepPoint(values=values, error=str(e)))
            continue
        out.points.append(SweepPoint(values=values, result=simulate(cfg)))
    return out
