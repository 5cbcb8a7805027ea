"""The API tier: a thin async FastAPI app in front of a TensorFlow Serving tier.

It validates raw requests, extracts features with pure functions and awaits the
serving tier over REST. It never imports TensorFlow: the model runs in the serving
tier, loaded once.
"""
