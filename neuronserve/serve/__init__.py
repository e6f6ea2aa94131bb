"""Launchers for the model servers, with truthful readiness."""
