#!/bin/sh
# Entry point of the walle_ray images (run under tini as PID 1).
#
#   docker run IMAGE                               -> python -m walle_ray (the default job)
#   docker run IMAGE algo=ppo env=cartpole         -> python -m walle_ray algo=ppo env=cartpole
#   docker run IMAGE --help | --cfg job | -m ...   -> python -m walle_ray --help | ...
#   docker run IMAGE ray start --head --block      -> runs that command unchanged
#
# Arguments that look like Hydra overrides (key=value, +key=value, ~key) or options (-x,
# --xyz) go to walle_ray; anything else is a command and runs as given. KubeRay sets the
# container command itself (`/bin/bash -lc -- "ray start ..."`), so it never passes here.
set -e

if [ "$#" -eq 0 ]; then
    exec python -m walle_ray
fi

case "$1" in
    -* | *=* | "~"*)
        exec python -m walle_ray "$@"
        ;;
esac

exec "$@"
