"""Serving on neuronserve's own workers: a deployment (its workers' store and run
folder), where its models come from, and the front in front of it (front/)."""
