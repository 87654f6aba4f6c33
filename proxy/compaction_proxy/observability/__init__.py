"""Observability: the Prometheus families and the in-process data behind the dashboard.

Everything is fed from one place, :meth:`.telemetry.Telemetry.record_request`, called once per
request where the access log is written, from what the request left on its context. The
modules, one job each:

* :mod:`.telemetry`: the per-request recording (the one entry point), feeding both sinks;
* :mod:`.prometheus`: the metric families and the collectors read at scrape time;
* :mod:`.dashboard`: the dashboard's aggregates and the JSON it polls;
* :mod:`.outcomes`: a request's summarizer calls reconciled with its report;
* :mod:`.recall`: a request's recall loop as it is read, and the outcome it counts under;
* :mod:`.labels`: label values (the route, the capped model name);
* :mod:`.prices`: USD per 1M input tokens, for the money saved;
* :mod:`.report_text`: a compaction report as text, what ``compaction-proxy compact`` prints.

Only the app, the CLI and the routes that serve the figures (``/metrics``, ``/dashboard``)
import it; the forwarding path (chat and pass-through) and every layer below the routes never
do (docs/architecture.md, "Layers and what each may import", checked by ``lint-imports``).
This file imports nothing, so importing one module does not load Prometheus.
"""
