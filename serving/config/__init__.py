"""Readers and checks of TF Serving's config protos (``tensorflow_serving/config/``)."""
