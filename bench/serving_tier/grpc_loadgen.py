"""The Python gRPC load generator (``python -m bench.serving_tier loadgen``, the fallback when
h2load is not installed) and the no-op gRPC server (``null-server``) that measures a
generator's ceiling."""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from bench.serving_tier.workload import (
    CALL_TIMEOUT_S,
    MODEL_NAME,
    OUTPUT_NAME,
    PREDICT_METHOD,
    grpc_requests,
)
from bench.stats import percentile


async def drive(
    target: str, rows: int, concurrency: int, duration_s: float, warmup_s: float
) -> dict[str, Any]:
    import grpc

    bodies = grpc_requests(rows)
    limit = 256 * 1024 * 1024
    options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
    async with grpc.aio.insecure_channel(target, options=options) as channel:
        predict = channel.unary_unary(PREDICT_METHOD)  # bytes in, bytes out
        await predict(bodies[0], timeout=30.0)  # fails fast if the server is not there
        loop = asyncio.get_running_loop()
        measure_from = loop.time() + warmup_s
        stop_at = measure_from + duration_s
        latencies: list[float] = []
        errors: dict[str, int] = {}
        ok = 0

        async def worker(offset: int) -> None:
            nonlocal ok
            index = offset
            while True:
                started = loop.time()
                if started >= stop_at:
                    return
                body = bodies[index % len(bodies)]
                index += 1
                try:
                    await predict(body, timeout=CALL_TIMEOUT_S)
                except grpc.aio.AioRpcError as exc:
                    if started >= measure_from:
                        errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                    continue
                if started >= measure_from:
                    ok += 1
                    latencies.append(loop.time() - started)

        cpu_before = time.process_time()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        cpu = time.process_time() - cpu_before
    latencies.sort()
    return {
        "ok": ok,
        "errors": errors,
        "duration_s": duration_s,
        "rps": ok / duration_s,
        "p50_ms": percentile(latencies, 50) * 1e3 if latencies else None,
        "p99_ms": percentile(latencies, 99) * 1e3 if latencies else None,
        "min_ms": latencies[0] * 1e3 if latencies else None,
        "mean_ms": statistics.fmean(latencies) * 1e3 if latencies else None,
        "sd_ms": statistics.pstdev(latencies) * 1e3 if latencies else None,
        "max_ms": latencies[-1] * 1e3 if latencies else None,
        "load_cpu_cores": cpu / (duration_s + warmup_s),
    }


def null_server(port: int) -> None:
    """A gRPC server answering every Predict with a canned response: the generator's ceiling."""
    import grpc

    from api.protos.tensorflow_serving.apis import predict_pb2

    answer = predict_pb2.PredictResponse()
    answer.model_spec.name = MODEL_NAME
    answer.outputs[OUTPUT_NAME].float_val.append(0.5)
    canned = answer.SerializeToString()

    async def predict(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return canned

    async def serve() -> None:
        server = grpc.aio.server()
        handler = grpc.method_handlers_generic_handler(
            "tensorflow.serving.PredictionService",
            {"Predict": grpc.unary_unary_rpc_method_handler(predict)},
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        print("null server ready", flush=True)
        await server.wait_for_termination()

    asyncio.run(serve())


