"""Command-line entry points: fleetctl and fleetd. They parse and format; the work is elsewhere."""
