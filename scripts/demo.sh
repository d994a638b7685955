#!/usr/bin/env bash
# `make demo`: run the main job on the embedded local default (see local/dedup_local/demo.py).
source "$(dirname "$0")/lib.sh"
exec "$DEDUP_CACHE/venv/bin/python" -m dedup_local.demo
