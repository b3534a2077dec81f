"""Workflows: one user-facing job each (evaluate, judge, compile, experiment), composing the layers below; the CLI
calls one workflow per command."""
