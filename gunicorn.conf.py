"""gunicorn settings for the API tier (`gunicorn -c gunicorn.conf.py 'api.app:create_app()'`).

Workers: WEB_CONCURRENCY, else one per CPU of the container's quota (not the host's
cores). Each worker is one uvicorn event loop; the model is not in these processes,
so a worker needs no more than one thread for NumPy/BLAS-style pools: the
OMP/MKL/OpenBLAS variables are pinned to 1 before anything imports them.
"""

import os

from api.cpu_budget import available_cpus

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

bind = os.environ.get("API_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", available_cpus()))
worker_class = "uvicorn_worker.UvicornWorker"
# The app factory does nothing at import and creates its clients in the lifespan,
# inside each worker, so preloading is safe and shares the imported code pages.
preload_app = True
# A worker finishing its in-flight requests on SIGTERM gets this long.
graceful_timeout = int(os.environ.get("API_GRACEFUL_TIMEOUT_S", "20"))
timeout = 30
keepalive = 5
accesslog = os.environ.get("API_ACCESS_LOG", "-") or None
