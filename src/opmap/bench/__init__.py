"""Load against a real serving endpoint: the open- / closed-loop client (client), server-sent events (sse),
the request values (records), the workload (workload), the figures (metrics) and the run's outputs (outputs).
httpx is imported only when a run starts."""
