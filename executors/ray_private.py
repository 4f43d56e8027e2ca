"""Every use of Ray's private API by the executor, in one place.

Ray's public API has no way to do these four things; each was checked against Ray 2.60.0 (the
version installed here; `pyproject.toml` allows `ray>=2.40,<3`). A Ray upgrade starts here: each
function says what it relies on, so a change in Ray fails in one known place.

  reload_auth_config   `ray._raylet.Config.initialize` and
                       `ray._raylet.AuthenticationTokenLoader.instance().reset_cache()`;
  loopback_only        `ray._private.ray_constants.ENABLE_RAY_CLUSTER`;
  loopback_init_args   `ray.init(_node_ip_address=...)`;
  system_config_args   a node's `_system_config` (`ray._private.parameter.RayParams`).
"""
from __future__ import annotations

import os
from typing import Any

RAY_VERSION_CHECKED = "2.60.0"
LOOPBACK = "127.0.0.1"


def reload_auth_config() -> None:
    """Make this process see token authentication and its token, set in the environment after
    `import ray`: Ray reads its config (`RAY_AUTH_MODE`, the token) once, when it is imported,
    and caches the token; these re-read both."""
    # lazy: Ray run only. ray._raylet (compiled) declares neither name to mypy.
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def loopback_only() -> None:
    """Make Ray take 127.0.0.1 as this node's address (its single-machine mode): Ray otherwise
    swaps a loopback node address for the machine's routable one
    (`ray._private.services.resolve_ip_for_localhost`), and an embedded cluster would listen
    beyond this machine. The module constant is read by this process, the environment
    variable by Ray's child processes."""
    import ray._private.ray_constants as rc  # lazy: Ray run only
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # rc.ENABLE_RAY_CLUSTERS_ENV_VAR
    rc.ENABLE_RAY_CLUSTER = False


def loopback_init_args() -> dict[str, Any]:
    """`ray.init` arguments that bind an embedded cluster to 127.0.0.1: `_node_ip_address` is
    the only way `ray.init` takes this node's address (with `loopback_only`, it is kept)."""
    return {"_node_ip_address": LOOPBACK}


def system_config_args(config: dict[str, int]) -> dict[str, dict[str, int]]:
    """Node arguments (a `ray.cluster_utils.Cluster` head's) that override Ray's internal
    config, e.g. the health-check period that decides how soon a lost node is declared dead:
    only `_system_config` reaches those settings."""
    return {"_system_config": config}
