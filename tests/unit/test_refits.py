"""Stage 2's refit scheduling (:mod:`streams.refits`): a refit that a stopping worker gives up leaves the models
as they were and ready to refit again, and publishes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

from models import parallel
from models.synthetic import gavel_observations
from streams.refits import Refits
from streams.stage2 import Stage2


def test_a_refit_given_up_at_a_stop_keeps_the_models_and_publishes_nothing() -> None:
    stage2 = Stage2()
    for o in gavel_observations(60, seed=2):
        stage2.on_observation(o)
    models = stage2.models["v100"]
    published: list[Any] = []

    async def publish(env: str, board: Any) -> None:
        published.append((env, board))

    refits = Refits(stage2, publish)
    task = models.refit_task()  # the refit in flight when the signal comes
    assert not models.refit_due()

    def stopped() -> Any:
        parallel.stop()
        try:
            return task()
        finally:
            parallel.resume()

    refits.running.add("v100")
    asyncio.run(refits._run("v100", stopped))
    assert published == [] and refits.running == set() and models.refits == 0
    assert models.refit_due()  # not left "in flight": a later start refits
