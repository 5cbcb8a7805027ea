# The API tier's image: the `api` extra only (no TensorFlow), run as a non-root user.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY api ./api
# Shared with the serving image (neither tier imports the other).
COPY http_hardening ./http_hardening
COPY cpu_quota.py ./
RUN pip install '.[api]'
COPY gunicorn.conf.py ./

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin app
USER app

EXPOSE 8000
CMD ["gunicorn", "-c", "gunicorn.conf.py", "api.app:create_app()"]
