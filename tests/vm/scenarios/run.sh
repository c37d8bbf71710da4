#!/bin/sh
# The run's script, in /opt/fleet-vm beside the scenarios, started by the image's runner
# (/usr/local/sbin/fleet-vmtest). The host installed the project's wheel and filled numba's
# cache (warm.py) before making the disk; every line for the host goes to /dev/ttyS1.
set -u
OUT=/dev/ttyS1
echo "FLEETVM BOOTED $(cut -d' ' -f1 /proc/uptime)" > $OUT
/opt/fleet-venv/bin/python /opt/fleet-vm/scenarios.py $(cat /opt/fleet-vm/only 2>/dev/null)
echo "FLEETVM DONE rc=$? uptime=$(cut -d' ' -f1 /proc/uptime)" > $OUT
