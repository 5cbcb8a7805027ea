#!/bin/bash
# The entrypoint of our model server's image, shaped like tensorflow/serving's own
# /usr/bin/tf_serving_entrypoint.sh: the same fixed ports and MODEL_NAME / MODEL_BASE_PATH,
# with the container's arguments appended (a --model_config_file among them wins over
# --model_name / --model_base_path, as it does for tensorflow_model_server). exec: the
# server is PID 1 and gets SIGTERM itself (it drains in-flight requests, then exits).
exec python -m serving --port=8500 --rest_api_port=8501 \
  --model_name="${MODEL_NAME}" --model_base_path="${MODEL_BASE_PATH}/${MODEL_NAME}" "$@"
