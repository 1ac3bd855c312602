"""Device maps as PyTorch defines them: checked at rendezvous, inverted for replies and gradients.

A worker's ``device_maps[peer]`` maps *its* devices to ``peer``'s devices, for the requests it
sends to ``peer`` (``rpc_sync``/``rpc_async``/``remote`` arguments, ``to_here`` asks nothing).
What comes back travels by the inverse map: the reply of that request, the value ``to_here``
fetches from the owner, and the gradients of distributed autograd. So the callee uses the
inverse of the *caller's* map, never a map of its own; every member publishes its maps at
rendezvous (``WorkerInfo.device_maps``) and rank 0 refuses a cluster whose maps are not
one-to-one, name unknown workers, or name devices a member does not have or did not list in
its ``devices`` option, so all ranks fail ``init_rpc`` with the same message.

CPU tensors never use a map: they leave from and arrive on the CPU. A CUDA tensor whose device
has no entry in the map of its direction is refused by the sender before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..._backend import Device, cupy_or_none
from ..._proto import worker_pb2 as pb

__all__ = [
    "DeviceRoute",
    "DeviceMaps",
    "normalize_device_map",
    "local_cuda_device_count",
    "publish",
    "validate",
]


class DeviceRoute(dict[str, str]):
    """A device map for one direction, and what to change when a device has no entry."""

    def __init__(self, entries: Mapping[str, str], missing_hint: str) -> None:
        super().__init__(entries)
        self.missing_hint = missing_hint


def _cuda_name(device: Any, what: str) -> str:
    if isinstance(device, int) and not isinstance(device, bool):
        device = f"cuda:{device}"
    try:
        dev = Device(device if isinstance(device, Device) else str(device))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: {exc}") from None
    if dev.type != "cuda":
        raise ValueError(
            f"{what}: device maps map CUDA devices, got {str(dev)!r}; CPU tensors always "
            "arrive on the CPU (move a tensor with .to('cpu') before sending it to a CPU-only peer)"
        )
    return str(dev)


def normalize_device_map(to: str, device_map: Mapping[Any, Any]) -> dict[str, str]:
    """``{0: 1}`` / ``{"cuda:0": "cuda:1"}`` -> ``{"cuda:0": "cuda:1"}``, one-to-one.

    Args:
        to: the peer the map is for (named in errors).
        device_map: local device -> device on ``to``; an int ``n`` means ``"cuda:n"``.

    Returns:
        The map with canonical device names.

    Raises:
        ValueError: a non-CUDA device, or two local devices mapped to one device of ``to``.
    """
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for k, v in device_map.items():
        src = _cuda_name(k, f"device map for {to!r}")
        dst = _cuda_name(v, f"device map for {to!r}")
        if dst in seen and seen[dst] != src:
            raise ValueError(
                f"device map for {to!r} must be one-to-one: {seen[dst]} and {src} both map to {dst}"
            )
        out[src], seen[dst] = dst, src
    return out


def local_cuda_device_count() -> int:
    """CUDA devices this process sees (0 without CuPy or a GPU)."""
    cp = cupy_or_none()
    return int(cp.cuda.runtime.getDeviceCount()) if cp is not None else 0


def publish(
    info: pb.WorkerInfo, maps: Mapping[str, Mapping[str, str]], devices: Sequence[str]
) -> None:
    """Fill the device fields of this worker's rendezvous record."""
    info.cuda_device_count = local_cuda_device_count()
    info.devices.extend(devices)
    for peer, mapping in maps.items():
        if mapping:
            info.device_maps[peer].devices.update(mapping)


def _index(device: str) -> int:
    return Device(device).index or 0


def validate(members: Sequence[pb.WorkerInfo], dynamic: bool = False) -> list[str]:
    """Every problem with the members' device maps, as sentences naming worker and device.

    Args:
        members: the rendezvous records of the whole cluster.
        dynamic: a dynamic group, where a map may name a worker that has not joined yet.

    Returns:
        An empty list when the maps are valid.
    """
    by_name = {m.name: m for m in members}
    problems: list[str] = []
    for m in members:
        for d in m.devices:
            if _index(d) >= m.cuda_device_count:
                problems.append(
                    f"worker {m.name!r} lists {d} in devices but sees {m.cuda_device_count} "
                    "CUDA devices"
                )
        for peer, dmap in sorted(m.device_maps.items()):
            if peer not in by_name and dynamic:
                continue
            if peer not in by_name:
                problems.append(
                    f"worker {m.name!r} has a device map for {peer!r}, which is not a worker of "
                    f"this cluster ({sorted(by_name)})"
                )
                continue
            other = by_name[peer]
            targets = list(dmap.devices.values())
            if len(set(targets)) != len(targets):
                problems.append(f"worker {m.name!r} maps two devices to one on {peer!r}")
            for src, dst in sorted(dmap.devices.items()):
                problems.extend(_check_end(m, src, f"its device map for {peer!r} maps {src}"))
                problems.extend(
                    _check_end(other, dst, f"worker {m.name!r} maps {src} to {dst} on it")
                )
    return problems


def _check_end(worker: pb.WorkerInfo, device: str, context: str) -> list[str]:
    if _index(device) >= worker.cuda_device_count:
        return [
            f"worker {worker.name!r} sees {worker.cuda_device_count} CUDA devices, but {context}"
        ]
    if worker.devices and device not in worker.devices:
        return [f"worker {worker.name!r} did not list {device} in devices, but {context}"]
    return []


class DeviceMaps:
    """The maps one worker sends by: its own per peer, and the inverse of each peer's map to it.

    Args:
        me: this worker's name.
        own: this worker's maps (peer -> local device -> peer device).
        members: the rendezvous records (None before the rendezvous: no inverse maps yet).
    """

    def __init__(
        self,
        me: str,
        own: Mapping[str, Mapping[str, str]],
        members: Sequence[pb.WorkerInfo] | None = None,
    ) -> None:
        self.me = me
        self._requests = {
            peer: DeviceRoute(
                m,
                f"add it to this worker's map: rpc_backend_options.set_device_map({peer!r}, "
                "{DEVICE: 'cuda:N'})",
            )
            for peer, m in own.items()
        }
        self._replies: dict[str, DeviceRoute] = {}
        for w in members or ():
            theirs = w.device_maps.get(me)
            self._replies[w.name] = DeviceRoute(
                {dst: src for src, dst in (theirs.devices.items() if theirs else ())},
                f"results and gradients go back by the inverse of the caller's map: on worker "
                f"{w.name!r}, rpc_backend_options.set_device_map({me!r}, {{'cuda:N': DEVICE}})",
            )

    def request(self, peer: str) -> DeviceRoute | None:
        """The map of a request (or ``remote``) this worker sends to ``peer``."""
        return self._requests.get(peer)

    def reply(self, peer: str) -> DeviceRoute | None:
        """The map of a reply (or fetched RRef value) to ``peer``: the inverse of its map to us."""
        return self._replies.get(peer)

    def gradients(self, peer: str, forward_was_reply: bool) -> DeviceRoute | None:
        """The map of gradients sent to ``peer`` for a message it sent us: the inverse of that
        message's map (our own map when it was the reply to our request)."""
        return self.request(peer) if forward_was_reply else self.reply(peer)
