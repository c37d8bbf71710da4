"""The faces a Python program uses: the embedded fleet (roles), the executor, and the
service-mode client of a running fleetd; map feeding, which all three share."""
