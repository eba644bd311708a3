"""The worker's HTTP views: current predictions, leaderboards, solo profiles and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from events import to_dict


def register(app: Any, streams: Any) -> None:
    """Add the views of ``streams`` (a :class:`streams.app.Streams`) to its faust ``app``."""

    @app.page("/predictions/{gpu_uuid}")
    async def predictions(web: Any, request: Any, gpu_uuid: str) -> Any:
        jobs = streams.serving.latest.get(gpu_uuid, {})
        return web.json({"gpu_uuid": gpu_uuid, "jobs": {j: {m: to_dict(p) for m, p in modes.items()} for j, modes in jobs.items()}})

    @app.page("/serving")
    async def serving(web: Any, request: Any) -> Any:
        """The snapshot version served per environment (-1: none yet; none with ``serving`` stage2), the GPUs served
        here and the input partitions assigned here."""
        s = streams.serving
        return web.json(
            {
                "mode": streams.settings.serving,
                "versions": s.versions,
                "gpus": sorted(s.latest),
                "counters": dict(s.counters),
                "partitions": sorted(streams.state.assigned),
            }
        )

    @app.page("/leaderboard")
    async def leaderboard(web: Any, request: Any) -> Any:
        return web.json({env: to_dict(b) for env, b in streams.stage2.leaderboards.items()})

    @app.page("/profiles")
    async def profiles(web: Any, request: Any) -> Any:
        return web.json(streams.stage1.profiles.view())

    @app.page("/metrics")
    async def metrics(web: Any, request: Any) -> Any:
        query = request.query  # aiohttp's multidict: name[] given once per series
        names = query.getall("name[]", []) if hasattr(query, "getall") else [v for k, v in query.items() if k == "name[]"]
        body, content_type = streams.metrics.render(names)
        return web.bytes(body, content_type=content_type)
