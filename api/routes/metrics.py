"""`GET /metrics`: Prometheus text exposition of `api.observability.metrics.ApiMetrics`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from api.observability.metrics import ApiMetrics

router = APIRouter(tags=["observability"])


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """The app's metrics (all workers' merged, in multiprocess mode).

    A sync `def` on purpose: FastAPI runs it in its threadpool, so reading the
    multiprocess files never holds the event loop.
    """
    api_metrics: ApiMetrics = request.app.state.metrics
    body, content_type = api_metrics.exposition()
    return Response(content=body, media_type=content_type)
