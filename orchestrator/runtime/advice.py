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
