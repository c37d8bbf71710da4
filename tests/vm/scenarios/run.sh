#!/bin/sh
# On the host's disk, run by the image's runner (/usr/local/sbin/fleet-vmtest): install
# the project's wheel into the image's venv, then the scenarios; every line for the host
# goes to the second serial port.
set -u
OUT=/dev/ttyS1
echo "FLEETVM BOOTED $(cut -d' ' -f1 /proc/uptime)" > $OUT
if ! /opt/fleet-venv/bin/pip install -q --no-index --no-deps /mnt/in/fleet-*.whl > /tmp/pip.log 2>&1; then
  echo "FLEETVM ERROR pip install of the project's wheel failed: $(tail -3 /tmp/pip.log | tr '\n' ' ')" > $OUT
  exit 1
fi
cp /mnt/in/fleet_vm_handlers.py /opt/fleet-venv/lib/python3.11/site-packages/
/opt/fleet-venv/bin/python /mnt/in/scenarios.py $(cat /mnt/in/only 2>/dev/null)
echo "FLEETVM DONE rc=$? uptime=$(cut -d' ' -f1 /proc/uptime)" > $OUT
