"""The in-process comparison apps: the same endpoint as the API, the model inside.

- `naive`: the "before" setup, Keras `model.predict` inside an `async def` handler.
- `tuned`: the best in-process setup, a Session callable in a sync `def` handler.
- `ceiling`: the same validation and feature extraction with no model at all.

All three reuse the API's own schemas and feature extraction (`examples.fraud.schemas`,
`examples.fraud.features`) through `bench.apps.common`, so the only difference between them and
the split setup is where and how the model runs.
"""
