#!/bin/sh
# Lab stand-in for the entrypoint script of NVIDIA's NGC images (/opt/nvidia/nvidia_entrypoint.sh),
# which prints a banner, sets up CUDA compatibility libraries and then runs the command it was given.
# The roles must keep it in front of their own command; the variable below shows that they did.
echo "== gpulab lab image (NGC-style entrypoint) =="
export GPULAB_LAB_NGC_ENTRYPOINT=1
if [ $# -eq 0 ]; then
    set -- python3 -c "print('gpulab lab image: give me a command')"
fi
exec "$@"
