"""Load on a server: an endpoint per protocol (what one request is and how it is sent),
the work sent, the generator that keeps N clients busy, and wrk beside it."""
