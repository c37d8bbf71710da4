"""The operating system seen from fleet: cgroups and the CPU quota, PSI, the posture sampler, scheduling priority, uids and files."""
