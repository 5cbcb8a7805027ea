# Two targets:
#   api       the API tier's image (tfserve-split/api): the `api` and `auth` extras only (no TensorFlow,
#             no example code), run as a non-root user. It serves the routes MODEL_ROUTES names:
#             build FROM it with your own package, as the `examples` target does.
#   examples  the API image plus the example routes (tfserve-split/api-examples), what
#             docker-compose.yml and deploy/k8s run by default.
#   docker build --target api -t tfserve-split/api:0.1.0 .
FROM python:3.11-slim AS api

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY api ./api
# Shared with the serving image (neither tier imports the other).
COPY http_hardening ./http_hardening
COPY canonical_codes.py cpu_quota.py otel_tracing.py ./
# api-tracing: OpenTelemetry, imported only when an OTEL_* variable turns tracing on, so that the
# deployment's one setting (OTEL_EXPORTER_OTLP_ENDPOINT) needs no other image.
RUN pip install '.[api,api-tracing,auth]'
COPY gunicorn.conf.py ./

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin app
USER app

EXPOSE 8000
CMD ["gunicorn", "-c", "gunicorn.conf.py", "api.app:create_app()"]

# The fraud and digits routes added to the API image the way a route of one's own is: their
# package on PYTHONPATH, the packages they need (the `examples` extra: python-multipart for the
# digits upload, Pillow to decode it), MODEL_ROUTES naming their declarations.
FROM api AS examples
USER root
COPY examples/__init__.py ./examples/
COPY examples/fraud ./examples/fraud
COPY examples/digits ./examples/digits
RUN pip install '.[examples]'
ENV PYTHONPATH=/app \
    MODEL_ROUTES=examples.fraud.route:route,examples.digits.route:route
USER app
