"""Load against a real serving endpoint: the open- / closed-loop client (client), server-sent events (sse),
the request values (records), the workload (workload), the figures (metrics) and the run's outputs (outputs),
over a lean HTTP/1.1 transport (http) and, to measure the client itself, a null server (nullserver)."""
