"""Evaluation and conformance: scripted upstreams, the conformance suite, the model eval harness.

Nothing here is on the product's request path; modules are imported by name
(e.g. ``toolforge.eval.scripted_upstream``) so importing the package costs nothing.
"""

__all__: list[str] = []
