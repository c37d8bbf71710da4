"""fleetd as a service: the daemon, the control protocol, replays, sd_notify, and the
Prometheus exporter either face of a fleet starts when ``[metrics]`` is on."""


def start_exporter(*, host: str, port: int, provider):
    """The Prometheus exporter of one fleet (`fleet.service.metrics.MetricsServer`),
    serving: what a fleet's boot starts when ``[metrics]`` is on. Loaded here on first
    use, so a fleet without metrics never imports prometheus_client."""
    from fleet.service.metrics import MetricsServer

    return MetricsServer(host=host, port=port, provider=provider).start()
