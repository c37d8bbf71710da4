"""fleet-burst: replay recorded bursts against a real fleet and a local provider.

`trace` (the format and its parser), `clock` (scaled trace time), `simulator` (the
local provider over HTTP) and `simulator_process` (it in a process of its own), `handlers` (the replay fleet's handlers), `replay` (the
driver and its modes; the admission mode is the fleet's own provider admission),
`report` (JSON, Markdown, PNG), `record` (arrivals from a running fleet), `gen` (the
shipped traces), `cli` (the `fleet-burst` command).
"""
