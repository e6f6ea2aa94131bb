"""`neuronserve bench`: load generation against endpoints (servers bench starts, running
servers, the Runner in process, the vanilla pipeline), percentiles and reports."""
