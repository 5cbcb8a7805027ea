"""What a deployment configures: the API's settings, the model routes it serves, serving's model config.

`settings` (`Settings`: every variable the API reads from the environment), `enabled_routes`
(which model routes `MODEL_ROUTES` enables, each with its `MODELS__<ROUTE>__...` settings
applied to its declaration), `serving_config` (serving's `--model_config_file`, read without
TensorFlow: `python -m api.config.serving_config FILE`).
"""
