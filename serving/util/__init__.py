"""TF Serving's ``util/``: errors, codecs, executors and metrics the other folders share."""
