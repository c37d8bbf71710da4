"""fleetd as a service: the daemon, the control protocol, its client, replays, sd_notify."""
