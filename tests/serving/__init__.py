"""The serving tier's tests (``serving/``): unit tests per module and end-to-end runs of ``python -m serving``."""
