"""Protos the model server needs without the wheels that ship them.

TF Serving's configuration protos that the ``tensorflow-serving-api`` wheel does not ship:
``--batching_parameters_file`` (``BatchingParameters``), ``--monitoring_config_file``
(``MonitoringConfig``) and ``--ssl_config_file`` (``SSLConfig``) are text protos whose messages
live in files the wheel leaves out, so their ``.proto`` sources are kept here with TF Serving's
file paths, package and field numbers, and the Python code is generated from them (``python -m
serving.protos.generate``; generated code, not linted). The messages are registered in a descriptor
pool of their own (:mod:`._pool`), so a future wheel that ships the same files cannot clash with
them.

TensorFlow's ``tf.Example`` (``tensorflow/core/example/{example,feature}.proto``), the same way:
the REST codec (:mod:`serving.util.json_example`) builds serialized Examples with them, since
importing TensorFlow's own generated code runs ``tensorflow/__init__.py`` (seconds, and every
library TensorFlow loads). The wire format is the same, which the tests check against TensorFlow's.
"""
