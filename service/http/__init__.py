"""The HTTP edge: the FastAPI app, its routes, the Prometheus exporter, the server thread."""
