"""Runtime tiers: the isolation a request's work runs under, by its normalized identity.

Five tiers, least isolated first: ``host``, ``container``, ``vm``, ``microvm``, ``custom``.
A caller may name its runtime as it knows it - ``VM``, ``docker``, ``Firecracker`` - and
the store counts it against the tier it belongs to, while the record keeps the name as
given (`Request.runtime`). Names are matched without regard to case or surrounding
blanks. A runtime the table below does not know is refused rather than guessed (a typo
must not move work into another tier's quota); a runtime of one's own is named
``custom:<name>`` (``custom:wasmtime``) and counts as ``custom``.

Pure: no imports beyond the standard library, no I/O.
"""
from __future__ import annotations

HOST = "host"
CONTAINER = "container"
VM = "vm"
MICROVM = "microvm"
CUSTOM = "custom"

#: The tiers, least isolated first. ``host`` admits one lease at a time unless the policy
#: sets its quota (`admission.store.base.HOST_TIER_DEFAULT_QUOTA`).
TIERS = (HOST, CONTAINER, VM, MICROVM, CUSTOM)

#: Runtime names as people and tools spell them -> the tier they run in (lower case).
ALIASES = {
    # processes straight on the host
    "bare-metal": HOST, "baremetal": HOST, "native": HOST, "process": HOST,
    # OCI and system containers
    "docker": CONTAINER, "podman": CONTAINER, "oci": CONTAINER, "containerd": CONTAINER, "cri-o": CONTAINER,
    "crio": CONTAINER, "runc": CONTAINER, "crun": CONTAINER, "lxc": CONTAINER, "lxd": CONTAINER,
    "systemd-nspawn": CONTAINER, "nspawn": CONTAINER,
    # full virtual machines
    "kvm": VM, "qemu": VM, "qemu-kvm": VM, "libvirt": VM, "xen": VM, "hyper-v": VM, "hyperv": VM,
    "virtualbox": VM, "vmware": VM, "bhyve": VM,
    # lightweight VMs of one workload each
    "firecracker": MICROVM, "cloud-hypervisor": MICROVM, "cloud_hypervisor": MICROVM, "kata": MICROVM,
    "kata-containers": MICROVM, "crosvm": MICROVM,
}

CUSTOM_PREFIX = f"{CUSTOM}:"


class UnknownTier(ValueError):
    """A runtime name that is no tier, no known alias and not ``custom:<name>``."""


def tier_of(name) -> str:
    """The tier runtime `name` runs in (see the module doc); UnknownTier when there is none.

    >>> tier_of("VM"), tier_of("docker"), tier_of(" Firecracker "), tier_of("custom:wasmtime")
    ('vm', 'container', 'microvm', 'custom')
    """
    if not isinstance(name, str):
        raise UnknownTier(f"a runtime tier is a name, not {type(name).__name__}")
    key = name.strip().lower()
    if key in TIERS:
        return key
    if key in ALIASES:
        return ALIASES[key]
    if key.startswith(CUSTOM_PREFIX) and key[len(CUSTOM_PREFIX):].strip():
        return CUSTOM
    raise UnknownTier(f"unknown runtime tier {name!r}: want one of {', '.join(TIERS)}, an alias "
                      f"({', '.join(sorted(ALIASES))}) or custom:<name>")
