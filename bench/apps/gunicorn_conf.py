"""gunicorn settings shared by the in-process comparison apps (naive, tuned, ceiling).

    gunicorn -c bench/apps/gunicorn_conf.py --workers=3 'bench.apps.naive:create_app()'

Passing a config file explicitly matters: without `-c`, gunicorn reads
`./gunicorn.conf.py` from the working directory, which is the API's (preload on,
workers from the CPU quota, thread variables). The comparison apps must get exactly
what their setup says, so `--workers` and `--preload` are given on the command line and
everything else is here.
"""

worker_class = "uvicorn_worker.UvicornWorker"
loglevel = "info"  # the benchmark counts "Application startup complete" lines for readiness
accesslog = None  # as the API: no per-request log line from gunicorn
preload_app = False  # `--preload` on the command line turns it on (tuned, ceiling)
# gunicorn kills a worker that has not reported for this long; importing TensorFlow in
# three workers at once on one core takes longer than the default 30 s.
timeout = 180
graceful_timeout = 10
keepalive = 5
# gunicorn >= 25.1 opens a control socket at one fixed path per user
# ($HOME/.gunicorn/gunicorn.ctl); several gunicorns at once would fight over it.
control_socket_disable = True
