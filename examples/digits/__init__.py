"""The digits example: one uploaded picture of a handwritten digit in, the digit out (`POST /v1/digits/classify`).

`route` (the declaration: `MODEL_ROUTES=examples.digits.route:route`), `images` (any PNG or
JPEG of a digit to the data set's 8x8 grid, shared with `models/train_digits.py`).
"""
