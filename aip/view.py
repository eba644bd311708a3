"""The live terminal view of the output topics, shared by ``aip up`` and ``aip top``.

:class:`LiveState` folds consumed records into per-GPU rows (job set, latest
measured and predicted interference, alert state), the leaderboards and counts
per topic; :meth:`LiveState.render` draws them with rich.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from aip.render import fmt_ts, render, served_text
from events import Alert, DeadLetter, Leaderboard, Observation, Prediction, Topics

OUTPUT_TOPICS = (
    "interference.observations",
    "interference.predictions",
    "interference.alerts",
    "models.leaderboard",
    "aip.deadletter",
)
COUNT_KEYS = {
    "interference.observations": "observations",
    "interference.predictions": "predictions",
    "interference.alerts": "alerts",
    "models.leaderboard": "leaderboard",
    "aip.deadletter": "deadletters",
}


@dataclass
class GpuRow:
    environment: str = ""
    job_set: list[str] = field(default_factory=list)
    window_end: float | None = None
    measured: dict[str, float | None] = field(default_factory=dict)  # job_id -> measured interference
    predicted: dict[str, float] = field(default_factory=dict)  # job_id -> latest prediction (observed mode first)
    alerts: dict[str, str] = field(default_factory=dict)  # job_id -> raised|cleared


class LiveState:
    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self.counts: Counter[str] = Counter({k: 0 for k in COUNT_KEYS.values()})
        self.undecodable = 0
        self.gpus: dict[str, GpuRow] = {}
        self.leaderboards: dict[str, Leaderboard] = {}
        self.recent: list[str] = []

    def add(self, item: Any) -> None:
        """Fold one :class:`transport.Received` item in."""
        base = self.topics.base(item.topic)
        key = COUNT_KEYS.get(base)
        if key is not None:
            self.counts[key] += 1
        if item.error is not None:
            self.undecodable += 1
            return
        r = item.record
        if isinstance(r, Observation):
            row = self.gpus.setdefault(r.gpu_uuid, GpuRow())
            if row.window_end is None or r.window_end >= row.window_end:
                if row.window_end != r.window_end:
                    row.measured = {k: v for k, v in row.measured.items() if k in (r.job_id, *r.co_job_ids)}
                row.window_end = r.window_end
                row.environment = r.environment
                row.job_set = sorted(
                    [f"{r.job_id}:{r.job_type}", *(f"{i}:{t}" for i, t in zip(r.co_job_ids, r.co_job_types, strict=False))]
                )
                row.measured[r.job_id] = r.interference_pct
        elif isinstance(r, Prediction):
            row = self.gpus.setdefault(r.gpu_uuid, GpuRow())
            if r.mode == "observed" or r.job_id not in row.predicted:
                row.predicted[r.job_id] = r.interference_pct
        elif isinstance(r, Alert):
            self.gpus.setdefault(r.gpu_uuid, GpuRow()).alerts[r.job_id] = r.state
            self._recent(render(r))
        elif isinstance(r, Leaderboard):
            self.leaderboards[r.environment] = r
        elif isinstance(r, DeadLetter):
            self._recent(render(r))

    def _recent(self, line: str) -> None:
        self.recent.append(line)
        del self.recent[:-6]

    def selected(self) -> dict[str, dict[str, str]]:
        return {env: dict(sorted(b.selected.items())) for env, b in sorted(self.leaderboards.items())}

    def served(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per environment, ``"<mode>:<regime>"`` -> the served model, its category and the error it was chosen by."""
        return {
            env: {
                f"{s.mode}:{s.regime}": {
                    "model": s.model, "category": s.category,
                    "error_pct": None if s.error_pct is None else round(s.error_pct, 3),
                }
                for s in b.served
            }
            for env, b in sorted(self.leaderboards.items())
        }  # fmt: skip

    def summary(self) -> dict[str, Any]:
        return {**{k: self.counts[k] for k in COUNT_KEYS.values()}, "served": self.served(), "selected": self.selected()}

    def render(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        gpus = Table(title="GPUs", expand=True)
        for col in ("GPU", "env", "window end", "jobs", "measured %", "predicted %", "alert"):
            gpus.add_column(col)
        for uuid, row in sorted(self.gpus.items()):
            jobs = [j.split(":")[0] for j in row.job_set]
            meas = " ".join("-" if row.measured.get(j) is None else f"{row.measured[j]:.0f}" for j in jobs)
            pred = " ".join(f"{row.predicted[j]:.0f}" if j in row.predicted else "-" for j in jobs)
            raised = [j for j, s in row.alerts.items() if s == "raised" and j in jobs]
            gpus.add_row(
                uuid[:16],
                row.environment,
                fmt_ts(row.window_end),
                ", ".join(row.job_set),
                meas,
                pred,
                ("[red]RAISED " + ",".join(raised) + "[/red]") if raised else "ok",
            )
        boards = Table(title="Served models (mode:regime = model/category, MAE it was chosen by)", expand=True)
        boards.add_column("environment")
        boards.add_column("observations")
        boards.add_column("served")
        for env, b in sorted(self.leaderboards.items()):
            boards.add_row(env, str(b.observations), "  ".join(served_text(s) for s in b.served))
        counts = "  ".join(f"{k}={v}" for k, v in self.counts.items())
        return Group(gpus, boards, counts, *self.recent)

