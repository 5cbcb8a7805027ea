"""TF Serving's ``batching/``: the batching session, its options and merge/split/pad."""
