#!/usr/bin/env bash
# make compose-test: the compose stack run for real (see compose_test.py for the steps).
#
# Uses Docker where a Docker engine answers, else rootful podman from Debian's packages
# (installed and configured by engine.sh when run as root with apt-get). Builds the images
# (build-images.sh), then runs the stack with our model server's image as `serving`: the
# official tensorflow/serving image cannot be pulled without a registry.
# About 8 minutes on a fresh 2-core machine (most of it TensorFlow's wheel in the serving
# image), about 2 once the images are built.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# shellcheck source=deploy/compose/engine.sh
source deploy/compose/engine.sh
engine_setup
started=$SECONDS
deploy/compose/build-images.sh
echo "compose-test: images ready in $((SECONDS - started)) s"
ENGINE=$ENGINE COMPOSE="${COMPOSE[*]}" "${PYTHON:-python3}" deploy/compose/compose_test.py "$@"
echo "compose-test: passed in $((SECONDS - started)) s"
