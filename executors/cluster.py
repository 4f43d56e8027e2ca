"""Getting a Ray cluster for a plan: an embedded one, or joining one at `--address`.

Resources the plan's bundles ask for (see `placer.solve.mapping.device_resources` and
`executors.placement`), read off the run plan (`executors.runplan`):
  GPU / LPU / CPU           device counts (CPU: cores) of the pool's device kind;
  pool_<pool>               devices of that pool, so that a plan lands on the pool it names;
  placer_node_<pool>_<i>    one key per plan node, so that a bundle lands on the very node the plan
                            maps it to (every plan node is one Ray node in a real cluster; an
                            embedded single-node Ray advertises all of them).
A machine without CUDA devices runs a plan's GPU pools *emulated*: Ray advertises the GPUs while
the math runs on CPU. LPU pools are always emulated (there is no LPU runtime here). Everything the
executor prints names the emulated pools.

Security: Ray's token authentication stays on (`RAY_AUTH_MODE=token`; an embedded cluster gets a
fresh random token in the environment unless one is configured), the dashboard is off and an
embedded cluster binds to 127.0.0.1 only. Joining a cluster (`join`) at a loopback address keeps
this driver on 127.0.0.1 too; an address beyond this machine is the one case where the driver
listens on a routable interface (the cluster's nodes must reach it), and only because it was
asked. An address is checked before Ray sees it (`parse_address`: `auto`, HOST:PORT or
ray://HOST:PORT) and its port is dialled with a short timeout (`reachable`): Ray itself retries
an unreachable GCS for minutes.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
import socket
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from executors import ray_private
from executors.runplan import RunPlan
from placer.base.errors import SpecError

NODE_UNITS = 1000.0  # a plan node advertises this much of its key; a bundle takes 1
DIAL_TIMEOUT_S = 5.0  # how long `reachable` waits for the address's port to answer
_HOST = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                   r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def node_key(pool: str, node: int) -> str:
    return f"placer_node_{pool}_{node}"


@dataclass
class ClusterInfo:
    address: str
    embedded: bool  # started by this run (`embed`): the run stops it (`stop`)
    emulated: list[str] = field(default_factory=list)  # pools whose devices are emulated
    pinned: bool = True  # bundles carry node keys (False: the joined cluster has none)

    def describe(self) -> str:
        where = "embedded Ray on 127.0.0.1" if self.embedded else f"Ray at {self.address}"
        emu = (f"; emulated pools (work runs on CPU): {', '.join(self.emulated)}"
               if self.emulated else "")
        pin = "" if self.pinned else "; nodes do not advertise placer_node_* keys: node pinning off"
        return where + emu + pin


def cuda_devices() -> int:
    try:
        import torch  # lazy: torch (~1.5 s) only to count GPUs; no torch: none
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - no usable torch or CUDA: no GPUs
        return 0


def emulated_pools(run: RunPlan) -> list[str]:
    """Pools the plan uses whose devices this machine does not have."""
    return [name for name in run.used_pools
            if run.pools[name].kind == "lpu"
            or (run.pools[name].kind == "gpu" and cuda_devices() == 0)]


def node_resources(run: RunPlan) -> dict[tuple[str, int], dict[str, float]]:
    """What each plan node must advertise: its pool's whole node plus its node key."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for pool_name, node in run.nodes:
        pool = run.pools[pool_name]
        out[(pool_name, node)] = {**pool.node_devices,
                                  f"pool_{pool_name}": float(pool.devices_per_node),
                                  node_key(pool_name, node): NODE_UNITS}
    return out


def ensure_token_auth() -> None:
    """Token authentication on; a fresh token for this process tree when none is configured."""
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    have = ("RAY_AUTH_TOKEN" in os.environ or "RAY_AUTH_TOKEN_PATH" in os.environ
            or (Path.home() / ".ray" / "auth_token").is_file())
    if not have:
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    # Ray read its config when it was imported; make this process see token mode and the token.
    ray_private.reload_auth_config()


def parse_address(address: str, flag: str = "--address") -> tuple[str, int] | None:
    """(host, port) of `[ray://]HOST:PORT` (HOST a name, an IPv4 address or a bracketed IPv6
    one); None for `auto` (Ray finds the cluster this machine runs). SpecError otherwise."""
    if address == "auto":
        return None
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    ok_host = bool(_HOST.match(bare))
    if not ok_host:
        try:
            ipaddress.ip_address(bare)
            ok_host = bare != host or "." in bare  # an IPv6 address needs its brackets
        except ValueError:
            ok_host = False
    if not sep or not ok_host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError(f"{flag}: not a Ray address: auto, HOST:PORT or ray://HOST:PORT "
                        f"(got {address!r})")
    return bare, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def reachable(address: str, flag: str = "--address") -> tuple[str, int] | None:
    """`parse_address`, then the port dialled (SpecError naming the address when nothing
    answers within `DIAL_TIMEOUT_S`)."""
    hp = parse_address(address, flag)
    if hp is None:
        return None
    try:
        socket.create_connection(hp, timeout=DIAL_TIMEOUT_S).close()
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        raise SpecError(f"{flag}: cannot reach Ray at {address!r}: {why} (got {address!r})"
                        ) from None
    return hp


def join(address: str, flag: str = "--address") -> None:
    """Connect this driver to the Ray cluster at `address` (checked and dialled first; token
    authentication on, `ensure_token_auth`); a loopback address keeps the driver on
    127.0.0.1."""
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it

    hp = reachable(address, flag)
    extra: dict[str, Any] = {}
    if hp is not None and is_loopback(hp[0]) and not address.startswith("ray://"):
        ray_private.loopback_only()
        extra = ray_private.loopback_init_args()
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True, **extra)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise SpecError(f"{flag}: cannot join Ray at {address!r}: "
                        f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None


def start(run: RunPlan, address: str | None = None) -> ClusterInfo:
    """Connect to `address`, or start an embedded Ray with everything the plan needs."""
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it

    ensure_token_auth()
    emulated = emulated_pools(run)
    if ray.is_initialized():  # a cluster this process joined before: the run only uses it
        short = shortfall(run, ray.cluster_resources())
        if short:
            raise SpecError(f"{'--address' if address else 'Ray'}: the Ray cluster this process "
                            f"is already connected to lacks what the plan's bundles ask for: "
                            f"{short} (got {address or 'the current cluster'!r})")
        return ClusterInfo(address or "current", False, emulated, _has_node_keys(run))
    if address:
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise SpecError(f"--address: cannot join Ray at {address!r}: "
                            f"{str(e).splitlines()[0]}") from None
        return ClusterInfo(address, False, emulated, _has_node_keys(run))
    embed(node_resources(run).values())
    return ClusterInfo("embedded", True, emulated, True)


def shortfall(run: RunPlan, have: dict[str, float]) -> str:
    """What the plan's bundles ask for in all (node keys aside: a cluster without them runs
    unpinned) beyond the totals `have`, in words; "" when nothing is short. A placement group
    asking for more than the cluster has would wait for its `create_groups` timeout and
    fail."""
    need: dict[str, float] = defaultdict(float)
    for slot in run.slots.values():
        for b in slot.bundles:
            for k, v in b.resources.items():
                need[k] += v
    short = {k: (v, have.get(k, 0.0)) for k, v in sorted(need.items())
             if v > have.get(k, 0.0) + 1e-9}
    return ", ".join(f"{k} {v:g} (has {h:g})" for k, (v, h) in short.items())


def stop(info: ClusterInfo) -> None:
    """Stop the embedded Ray a run started (`start`); a cluster it joined or found is left
    up. A later run in this process starts its own, advertising that run's resources: one left
    running would be reused with the first plan's (and none of, say, an LPU pool only the
    second plan uses)."""
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
    if info.embedded and ray.is_initialized():
        ray.shutdown()


def embed(nodes: Iterable[dict[str, float]]) -> None:
    """Start an embedded Ray advertising every one of `nodes`' resources (each a plan node's
    `node_resources`; a fleet's jobs' nodes together, `executors.fleetrun`)."""
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it

    total: dict[str, float] = defaultdict(float)
    for r in nodes:
        for k, v in r.items():
            total[k] += v
    ray_private.loopback_only()
    cpus = max(total.pop("CPU", 0.0), float(os.cpu_count() or 1))
    gpus = total.pop("GPU", 0.0)
    if cuda_devices():  # real GPUs: advertise what exists, not what the plan hopes for
        gpus = float(cuda_devices())
    ray.init(address="local", num_cpus=int(cpus), num_gpus=int(gpus), resources=dict(total),
             include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True,
             configure_logging=True, **ray_private.loopback_init_args())


def _has_node_keys(run: RunPlan) -> bool:
    import ray  # lazy: Ray (~1 s) only for a Ray run; local runs never load it
    have = ray.cluster_resources()
    return all(node_key(p, n) in have for p, n in run.nodes)
