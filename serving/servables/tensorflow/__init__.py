"""TF Serving's ``servables/tensorflow/``: a SavedModel servable and the APIs run on it."""
