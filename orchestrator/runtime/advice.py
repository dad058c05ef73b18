"""What to do about a symptom: the field report's troubleshooting table, shared by the preflight,
the dtype guard and the step timer."""

from __future__ import annotations

# The field report's troubleshooting table: symptom -> cause -> fix.
TROUBLESHOOTING: dict[str, dict[str, str]] = {
    "data_starvation": {
        "symptom": "memory fine, utilisation very low",
        "cause": "data pipeline blocked",
        "fix": "raise DataLoader num_workers (4 -> 8 -> 16), pin_memory=True, pre-decode and cache samples in memory",
    },
    "communication": {
        "symptom": "communication share too high",
        "cause": "collective library not adapted to the card",
        "fix": "use the collective library the vendor tunes for its cards (the profile's dist_backend), "
               "larger gradient accumulation, gradient compression",
    },
    "communication_host": {
        "symptom": "communication share too high on CPU (gloo)",
        "cause": "gloo all-reduces through host memory and TCP, on the cores that also compute",
        "fix": "fewer all-reduces per sample (larger gradient accumulation), fewer ranks per node with more "
               "threads each, gradient compression",
    },
    "communication_tuned": {
        "symptom": "communication share too high with the vendor's own collective library",
        "cause": "the interconnect, or all-reduces the backward pass cannot hide",
        "fix": "larger gradient accumulation, larger DDP buckets (bucket_cap_mb), gradient compression; "
               "check the links between the cards and the nodes",
    },
    "random_crashes": {
        "symptom": "random crashes in training",
        "cause": "unstable network or PCIe link",
        "fix": "lower communication frequency, check links",
    },
    "low_precision": {
        "symptom": "loss swings or NaN under bf16",
        "cause": "incomplete low-precision operator support",
        "fix": "verify with fp16 / fp32 (the dtype guard steps down automatically)",
    },
    "resume_repeats_data": {
        "symptom": "loss does not fall after resume",
        "cause": "data position repeated",
        "fix": "save and restore the DataLoader index (the runtime's resumable sampler)",
    },
    "numa_imbalance": {
        "symptom": "uneven utilisation across cards",
        "cause": "CPU binding / NUMA imbalance",
        "fix": "bind each rank to its own core group (wmctl-bind, affinity: exclusive)",
    },
    "no_devices": {
        "symptom": "the driver is visible but PyTorch sees no device",
        "cause": "driver version does not match the image's runtime, or the vendor toolkit is not in the container",
        "fix": "use the vendor's image matching the host driver, or mount the vendor runtime path into the container",
    },
}


def hint(key: str) -> str:
    row = TROUBLESHOOTING[key]
    return f"{row['cause']}: {row['fix']}"


def communication_hint(accelerator: bool, tuned: str | None, in_use: str | None) -> str:
    """The communication advice that fits the job: on CPU there is no vendor library to switch to;
    a job already on the vendor's own library is told what else helps; a job on another one (gloo
    on an accelerator) is told which library to use, by name.

    ``accelerator``: the job computes on an accelerator; ``tuned``: the collective library its
    vendor profile names (dist_backend); ``in_use``: the process group's backend, when known.
    """
    if not accelerator:
        return hint("communication_host")
    if tuned and in_use and in_use.lower() == tuned.lower():
        return hint("communication_tuned")
    row = TROUBLESHOOTING["communication"]
    if tuned and in_use:
        return (f"{row['cause']}: this job all-reduces with {in_use}; use {tuned}, the library the vendor tunes "
                "for its cards (the profile's dist_backend), then larger gradient accumulation, gradient compression")
    if tuned:
        return (f"{row['cause']}: all-reduce with {tuned}, the library the vendor tunes for its cards (the "
                "profile's dist_backend), then larger gradient accumulation, gradient compression")
    return hint("communication")
