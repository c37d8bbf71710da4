"""I/O-bound seats: the event loop, its selector and thread pools."""
